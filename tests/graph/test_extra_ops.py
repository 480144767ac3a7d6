"""The extra ops (frontend/onnx/extra_ops.py decompositions, the TopK and CumProd catalogue
ops and their kernels): the imported graph run by the numpy oracle against onnx's
ReferenceEvaluator, a few models compiled for the CPU (and TopK for CUDA through the
emulator), and the one-line errors."""
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import hidetc
import hidetc.tools.onnx_backend as backend
from hidetc.errors import HidetcError, ModelError
from hidetc.frontend import import_model
from hidetc.graph.reference import run_graph

F, D, I32, I64, U64, B = (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32,
                          TensorProto.INT64, TensorProto.UINT64, TensorProto.BOOL)
RNG = np.random.default_rng(7)


def model(op, inputs, n_out=1, opset=21, consts=None, **attrs):
    """A one-node model. inputs: name -> array, or None for an omitted input; those also
    in consts (name -> array) are initializers, the others graph inputs."""
    consts = consts or {}
    names = list(inputs)
    node = helper.make_node(op, [n if inputs[n] is not None else "" for n in names],
                            [f"y{i}" for i in range(n_out)], name="n", **attrs)
    ins = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in inputs.items() if a is not None and n not in consts]
    outs = [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)]
    inits = [numpy_helper.from_array(consts[n], n) for n in consts]
    graph = helper.make_graph([node], "g", ins, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def feeds(inputs, consts):
    return {n: a for n, a in inputs.items() if a is not None and n not in (consts or {})}


def check_oracle(op, inputs, consts=None, n_out=1, opset=21, rtol=1e-5, atol=1e-6,
                 **attrs):
    """The imported graph (numpy oracle) against onnx's reference implementation."""
    inputs = {**inputs, **(consts or {})}
    proto = model(op, inputs, n_out, opset, consts, **attrs)
    run = feeds(inputs, consts)
    ours = list(run_graph(import_model(proto), run).values())
    theirs = ReferenceEvaluator(proto).run(None, run)
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape, (a.dtype, a.shape, b.dtype, b.shape)
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return proto, run, theirs


def rand(*shape, dtype=np.float32):
    return RNG.uniform(-3, 3, shape).astype(dtype)


def compiled(proto, run):
    with backend.prepare(proto, "CPU") as rep:
        return list(rep.run(run))


# decompositions against the onnx reference ----------------------------------------------
@pytest.mark.parametrize("indices, attrs", [([[1, 0, 4], [-1, 2, 3]], {"axis": 1}),
                                            ([[2, 0, 1, 0, 2]], {})])
def test_scatter_is_scatter_elements(indices, attrs):
    """(the reference has no Scatter: compared with its ScatterElements)"""
    idx = np.array(indices, np.int64)
    inputs = {"d": rand(3, 5), "i": idx, "u": rand(*idx.shape)}
    ours = run_graph(import_model(model("Scatter", inputs, opset=10, **attrs)), inputs)
    theirs = ReferenceEvaluator(model("ScatterElements", inputs, opset=11, **attrs))
    np.testing.assert_array_equal(ours["y0"], theirs.run(None, inputs)[0])


@pytest.mark.parametrize("attrs", [{}, {"k": 2}, {"k": -1, "dtype": F}, {"k": 9},
                                   {"dtype": TensorProto.BOOL}])
def test_eye_like(attrs):
    check_oracle("EyeLike", {"x": np.zeros((4, 6), np.int32)}, opset=22, **attrs)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("size", [1, 7, 10])
def test_windows(op, periodic, size):
    if size == 1 and not periodic:
        pytest.skip("N - 1 = 0: the reference divides by zero (nan)")
    check_oracle(op, {}, consts={"n": np.array(size, np.int64)}, opset=17, periodic=periodic)
    check_oracle(op, {}, consts={"n": np.array(size, np.int32)}, opset=17,
                 output_datatype=D, periodic=periodic)


@pytest.mark.parametrize("bins, length, rate, low, high", [
    (8, 16, 8192, 0.0, 4096.0), (20, 512, 16000, 20.0, 8000.0), (5, 33, 100, 3.0, 40.0),
    (4, 1000, 16000, 300.0, 301.0), (1, 2, 10, 0.0, 0.0)])
def test_mel_weight_matrix(bins, length, rate, low, high):
    """A constant: against onnx's reference (ONNX Runtime computes the same), including
    degenerate triangles (edges on one bin) and a float64 output."""
    consts = {"m": np.array(bins, np.int64), "d": np.array(length, np.int64),
              "r": np.array(rate, np.int64), "lo": np.array(low, np.float32),
              "hi": np.array(high, np.float32)}
    proto, _, _ = check_oracle("MelWeightMatrix", {}, consts=consts, opset=17, rtol=0, atol=0)
    assert not import_model(proto).nodes
    check_oracle("MelWeightMatrix", {}, consts=consts, opset=17, output_datatype=D)


@pytest.mark.parametrize("shape, dtype", [((2, 2), np.float32), ((3, 2, 2), np.float32),
                                          ((2, 3, 5, 5), np.float32), ((4, 4), np.float64),
                                          ((1, 1), np.float32), ((3, 3), np.float16)])
def test_det(shape, dtype):
    """Det by elimination with partial pivoting: against onnx's reference and numpy
    (float64), imported and compiled; a singular matrix and one whose first pivot is
    zero (a row swap needed) included."""
    x = RNG.standard_normal(shape).astype(dtype)
    if shape == (3, 2, 2):
        x[1] = [[0, 2], [3, 1]]              # pivot 0 in place: rows swapped, sign flips
        x[2] = [[1, 2], [2, 4]]              # singular
    tol = 2e-3 if dtype == np.float16 else 1e-5
    want = np.linalg.det(x.astype(np.float64))
    if dtype == np.float16:          # (the onnx reference has no float16 det)
        proto, run = model("Det", {"x": x}, opset=22), {"x": x}
    else:
        proto, run, _ = check_oracle("Det", {"x": x}, opset=22, rtol=tol, atol=tol)
    for got in (run_graph(import_model(proto), run)["y0"], compiled(proto, run)[0]):
        assert got.dtype == dtype and got.shape == shape[:-2]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("shape, oc, attrs, extras", [
    ((1, 2, 5, 6), 4, {"group": 2, "kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, ()),
    ((2, 4, 7, 5), 6, {"group": 2, "offset_group": 2, "kernel_shape": [3, 2],
                       "strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 2, 1]},
     ("B", "mask")),
    ((1, 3, 1, 6), 2, {"offset_group": 3, "kernel_shape": [1, 3], "strides": [1, 2],
                       "pads": [0, 1, 0, 1]}, ("mask",))])
def test_deform_conv(shape, oc, attrs, extras):
    """DeformConv as GridSample taps + a grouped MatMul: offsets up to a few pixels
    (taps off the image), groups, offset groups, strides, dilations, pads, mask and
    bias; against ONNX Runtime and onnx's reference (which divides by zero on a 1-pixel
    dimension: ORT only there), imported and compiled."""
    n, c, h, w = shape
    kh, kw = attrs["kernel_shape"]
    sh, sw = attrs.get("strides", [1, 1])
    dh, dw = attrs.get("dilations", [1, 1])
    pt, pl, pb, pr = attrs["pads"]
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    og, g = attrs.get("offset_group", 1), attrs.get("group", 1)
    inputs = {"x": rand(n, c, h, w), "w": rand(oc, c // g, kh, kw),
              "off": rand(n, og * kh * kw * 2, oh, ow),
              "b": rand(oc) if "B" in extras else None,
              "m": RNG.random((n, og * kh * kw, oh, ow)).astype(np.float32)
              if "mask" in extras else None}
    if inputs["m"] is None:
        del inputs["m"]
    proto = model("DeformConv", inputs, opset=19, **attrs)
    run = feeds(inputs, {})
    import onnxruntime as ort
    want = ort.InferenceSession(proto.SerializeToString()).run(None, run)[0]
    if h > 1 and w > 1:
        np.testing.assert_allclose(ReferenceEvaluator(proto).run(None, run)[0], want,
                                   rtol=1e-5, atol=1e-5)
    for got in (run_graph(import_model(proto), run)["y0"], compiled(proto, run)[0]):
        assert got.shape == (n, oc, oh, ow)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("axis, cond", [(0, [0, 1, 1]), (1, [1, 0, 1, 1]), (-1, [0, 1]),
                                        (None, [1, 0, 0, 1, 1, 0, 1]), (0, [0, 0, 0])])
def test_compress(axis, cond):
    attrs = {} if axis is None else {"axis": axis}
    check_oracle("Compress", {"x": rand(3, 4)}, consts={"c": np.array(cond, bool)},
                 opset=11, **attrs)


@pytest.mark.parametrize("batch_axis, lens", [(0, [4, 1, 3, 2, 0]), (1, [1, 2, 3, 4, 4])])
def test_reverse_sequence(batch_axis, lens):
    shape = (5, 4, 2) if batch_axis == 0 else (4, 5, 2)
    check_oracle("ReverseSequence", {"x": rand(*shape), "l": np.array(lens, np.int64)},
                 opset=10, batch_axis=batch_axis, time_axis=1 - batch_axis)


DFT_CASES = [
    # (shape, axis, dft_length, inverse, onesided)
    ((2, 8, 3, 1), 1, None, 0, 0),
    ((2, 7, 3, 2), 2, None, 0, 0),
    ((2, 7, 3, 2), -3, 5, 0, 0),      # truncated
    ((2, 6, 1), 1, 9, 0, 1),          # zero-padded, one-sided
    ((3, 5, 2), 1, None, 1, 0),       # inverse
    ((1, 6, 4, 2), 1, None, 1, 1),    # irfft, default length 2(n-1) = 10
    ((1, 5, 4, 2), 1, 9, 1, 1),       # irfft of odd length
    ((4, 3, 1), 0, 7, 0, 1),
]


@pytest.mark.parametrize("shape, axis, length, inverse, onesided", DFT_CASES)
@pytest.mark.parametrize("opset", [19, 20])
def test_dft(shape, axis, length, inverse, onesided, opset):
    x = rand(*shape)
    consts = {"len": np.array(length, np.int64)} if length is not None else {}
    inputs = {"x": x, "len": None} if length is None else {"x": x}
    if opset >= 20:
        consts["axis"] = np.array(axis, np.int64)
        attrs = {}
    else:
        attrs = {"axis": axis}
    check_oracle("DFT", inputs, consts, opset=opset, rtol=1e-4, atol=1e-4,
                 inverse=inverse, onesided=onesided, **attrs)


@pytest.mark.parametrize("channels, window, frame_length, onesided",
                         [(1, True, None, 1), (1, False, 16, 1), (2, True, 16, 0),
                          (1, True, 12, 0)])
def test_stft(channels, window, frame_length, onesided):
    consts = {"step": np.array(8, np.int64)}
    inputs = {"x": rand(2, 70, channels), "step": None,
              "w": rand(16 if frame_length is None else frame_length) if window else None}
    if frame_length is not None:
        consts["fl"] = np.array(frame_length, np.int64)
    check_oracle("STFT", inputs, consts, opset=17, rtol=1e-4, atol=1e-4, onesided=onesided)


# TopK and CumProd: references, then kernels ---------------------------------------------
TIES = np.array([[3, 1, 3, 2, 3], [0, 0, 0, 0, 0], [5, 4, 3, 2, 1]], np.int64)
TOPK_CASES = [
    # (x, k, attrs)
    (TIES, 3, {"axis": 1}),
    (TIES, 4, {"axis": -1, "largest": 0}),
    (TIES, 2, {"axis": 0}),
    (TIES.astype(np.uint64), 5, {"axis": 1, "largest": 0}),
    (np.array([[1.0, np.nan, 2.0, np.nan, -1.0, 2.0]], np.float32), 4, {}),
    (np.array([[1.0, np.nan, 2.0, np.nan, -1.0, 2.0]], np.float32), 5, {"largest": 0}),
    (np.round(rand(3, 7, 4)), 3, {"axis": 1, "sorted": 1}),
    (rand(2, 3, 5), 1, {"axis": 2}),
]


@pytest.mark.parametrize("x, k, attrs", TOPK_CASES)
def test_topk_reference(x, k, attrs):
    check_oracle("TopK", {"x": x}, {"k": np.array([k], np.int64)}, n_out=2, opset=11,
                 atol=0, **attrs)


def test_topk_attribute_k():
    check_oracle("TopK", {"x": TIES}, n_out=2, opset=9, k=2, axis=1)


@pytest.mark.parametrize("case", [0, 1, 3, 4, 6])
def test_topk_compiled(case):
    x, k, attrs = TOPK_CASES[case]
    proto, run, theirs = check_oracle("TopK", {"x": x}, {"k": np.array([k], np.int64)},
                                      n_out=2, opset=11, atol=0, **attrs)
    for a, b in zip(compiled(proto, run), theirs):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_topk_cuda_emulated(tmp_path):
    x, k, attrs = TOPK_CASES[6]
    proto = model("TopK", {"x": x, "k": np.array([k], np.int64)}, 2, 11,
                  {"k": np.array([k], np.int64)}, **attrs)
    path = tmp_path / "model.onnx"
    onnx.save(proto, path)
    hidetc.compile_model(path, tmp_path / "out", target="cuda", arch="sm_90")
    got = hidetc.load(tmp_path / "out", emulate=True).run({"x": x})
    theirs = ReferenceEvaluator(proto).run(None, {"x": x})
    np.testing.assert_array_equal(got["y0"], theirs[0])
    np.testing.assert_array_equal(got["y1"], theirs[1])


CUMPROD_ATTRS = [{}, {"exclusive": 1}, {"reverse": 1}, {"exclusive": 1, "reverse": 1}]


@pytest.mark.parametrize("attrs", CUMPROD_ATTRS)
def test_cumprod_reference(attrs):
    check_oracle("CumProd", {"x": rand(3, 4, 2), "a": np.array(1, np.int64)}, opset=26,
                 **attrs)


@pytest.mark.parametrize("attrs", CUMPROD_ATTRS)
def test_cumprod_compiled(attrs):
    x = RNG.uniform(0.5, 1.5, (3, 4, 2)).astype(np.float32)
    ints = RNG.integers(-3, 4, (5, 3)).astype(np.int32)
    for data, axis in ((x, -2), (ints, 0)):
        inputs = {"x": data, "a": np.array(axis, np.int64)}
        proto, run, theirs = check_oracle("CumProd", inputs, opset=26, **attrs)
        np.testing.assert_allclose(compiled(proto, run)[0], theirs[0], rtol=1e-5)


def test_decompositions_compiled():
    dft = check_oracle("DFT", {"x": rand(2, 6, 3, 2), "len": None},
                       {"axis": np.array(-3, np.int64)},
                       opset=20, rtol=1e-4, atol=1e-4, inverse=1)
    rev = check_oracle("ReverseSequence", {"x": rand(3, 4), "l": np.array([2, 4, 1], np.int64)},
                       opset=10, batch_axis=0, time_axis=1)
    for proto, run, theirs in (dft, rev):
        np.testing.assert_allclose(compiled(proto, run)[0], theirs[0], rtol=1e-4, atol=1e-5)


# errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("op, inputs, consts, attrs, opset, message", [
    ("Compress", {"x": rand(3), "c": np.array([1, 0, 1], bool)}, {}, {"axis": 0}, 11,
     r"node 'n' \(Compress\): input 1 \(condition\) must be a constant known at compile"),
    ("Compress", {"x": rand(3)}, {"c": np.array([0, 0, 0, 1], bool)}, {"axis": 0}, 11,
     "selects position 3, past the axis extent 3"),
    ("DFT", {"x": rand(2, 4, 2)}, {}, {"axis": 2}, 19, "is the last"),
    ("DFT", {"x": rand(2, 4, 3)}, {}, {}, 19, "last dimension of 1"),
    ("HannWindow", {"n": np.array(4, np.int64)}, {}, {}, 17, r"input 0 \(size\)"),
    ("EyeLike", {"x": rand(2, 2, 2)}, {}, {}, 22, "expected a 2-D tensor"),
    ("ReverseSequence", {"x": rand(3, 4), "l": np.array([1, 2], np.int64)}, {},
     {"batch_axis": 0, "time_axis": 1}, 10, r"expected int64 \[3\]"),
    ("TopK", {"x": rand(3, 4)}, {"k": np.array([5], np.int64)}, {}, 11, "expected 0..4"),
    ("DeformConv", {"x": rand(1, 2, 5, 5), "w": rand(3, 2, 3, 3), "o": rand(1, 18, 4, 4)},
     {}, {}, 19, r"offset has shape \[1, 18, 4, 4\], expected \[1, 18, 3, 3\]"),
    ("DeformConv", {"x": rand(1, 2, 5, 5), "w": rand(3, 2, 3, 3), "o": rand(1, 18, 3, 3)},
     {}, {"strides": [0, 1]}, 19, r"strides \[0, 1\].*expected strides and dilations >= 1"),
    ("DeformConv", {"x": rand(1, 2, 5, 5), "w": rand(3, 2, 3, 3), "o": rand(1, 18, 3, 3)},
     {}, {"pads": [1, 1]}, 19, r"attribute 'pads' has 2 values, expected 4"),
    ("Det", {"x": rand(2, 3, 4)}, {}, {}, 13,
     r"input X has shape \[2, 3, 4\], expected \[\*, M, M\] \(square matrices\)"),
    ("MelWeightMatrix", {}, {"m": np.array(4, np.int64), "d": np.array(16, np.int64),
                             "r": np.array(100, np.int64), "lo": np.array(0, np.float32),
                             "hi": np.array(90, np.float32)}, {}, 17,
     r"the mel edges 0..90 Hz fall on spectrogram bins 0..12, outside 0..8"),
])
def test_errors_are_one_line(op, inputs, consts, attrs, opset, message):
    proto = model(op, {**inputs, **consts}, 2 if op == "TopK" else 1, opset, consts, **attrs)
    with pytest.raises(HidetcError, match=message) as info:
        import_model(proto)
    assert "\n" not in str(info.value)
    if op != "TopK":
        assert isinstance(info.value, ModelError)


def _roi_model(attrs, opset=16, n=2, c=3, h=9, w=11, rois=8):
    x = rand(n, c, h, w)
    corners = RNG.uniform(-3, 13, (rois, 2, 2))
    boxes = np.concatenate([corners.min(1), corners.max(1)], axis=1).astype(np.float32)
    boxes[0] = [2.0, 1.0, 2.0, 1.0]                         # empty box
    boxes[1] = [-20.0, -20.0, -15.0, -12.0]                 # off the image: samples count 0
    inputs = {"x": x, "rois": boxes,
              "b": RNG.integers(0, n, rois).astype(np.int64)}
    return model("RoiAlign", inputs, opset=opset, **attrs), inputs


@pytest.mark.parametrize("attrs", [
    {"output_height": 3, "output_width": 4, "sampling_ratio": 2, "spatial_scale": 0.75},
    {"output_height": 5, "output_width": 2, "sampling_ratio": 1,
     "coordinate_transformation_mode": "output_half_pixel"},
    {"mode": "max", "output_height": 2, "output_width": 3, "sampling_ratio": 3},
    {"mode": "max", "output_height": 4, "output_width": 4, "sampling_ratio": 2,
     "coordinate_transformation_mode": "output_half_pixel", "spatial_scale": 1.5}])
def test_roi_align(attrs):
    """RoiAlign as a catalogue op with a compute definition: against ONNX Runtime (and
    onnx's reference), imported and compiled for the cpu; boxes partly or wholly off the
    image, an empty box, scaled coordinates, both modes and both coordinate modes."""
    import onnxruntime as ort
    proto, inputs = _roi_model(attrs)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, inputs)[0]
    np.testing.assert_allclose(ReferenceEvaluator(proto).run(None, inputs)[0], want,
                               rtol=1e-5, atol=1e-5)
    for got in (run_graph(import_model(proto), inputs)["y0"], compiled(proto, inputs)[0]):
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_roi_align_10_is_output_half_pixel():
    attrs = {"output_height": 2, "output_width": 2, "sampling_ratio": 2}
    proto, inputs = _roi_model(attrs, opset=10)
    graph = import_model(proto)
    assert graph.nodes[0].attr("coordinate_transformation_mode") == "output_half_pixel"
    ref, _ = _roi_model({**attrs, "coordinate_transformation_mode": "output_half_pixel"})
    np.testing.assert_array_equal(run_graph(graph, inputs)["y0"],
                                  run_graph(import_model(ref), inputs)["y0"])


def test_roi_align_adaptive_sampling_is_refused():
    proto, _ = _roi_model({"output_height": 2, "output_width": 2})
    with pytest.raises(HidetcError, match=r"sampling_ratio=0: the adaptive sample count"):
        import_model(proto)


@pytest.mark.parametrize("shape, dtype, attrs", [
    ((3, 17), np.int32, {"mode": "TF", "min_gram_length": 1, "max_gram_length": 3,
                         "max_skip_count": 2}),
    ((25,), np.int64, {"mode": "TFIDF", "min_gram_length": 2, "max_gram_length": 3,
                       "max_skip_count": 1, "weights": [0.5, 2.0, 3.0, 1.0, 1.5, 4.0, 0.25, 7.0]}),
    ((2, 9), np.int64, {"mode": "IDF", "min_gram_length": 1, "max_gram_length": 2,
                        "max_skip_count": 4, "weights": [1.0, 2, 3, 4, 5, 6, 7, 8]}),
    ((4, 3), np.int32, {"mode": "IDF", "min_gram_length": 3, "max_gram_length": 3,
                        "max_skip_count": 3})])
def test_tfidf_vectorizer(shape, dtype, attrs):
    """TfIdfVectorizer over integers as constant-window Gathers, Equal against the pool
    and reductions: against ONNX Runtime, imported and compiled; unigrams, bigrams and
    trigrams with skips, permuted output columns, all three modes, 1-D and 2-D input."""
    import onnxruntime as ort
    x = RNG.integers(0, 4, shape).astype(dtype)
    x.reshape(-1)[:3] = [2, 2, 1]                           # the first trigram, at least
    pool = [1, 3, 0, 2, 1, 1, 3, 0, 2, 2, 1, 0, 1, 3]       # 4 unigrams, 2 bigrams, 2 trigrams
    attrs = {"pool_int64s": pool, "ngram_counts": [0, 4, 8],
             "ngram_indexes": [3, 0, 8, 1, 2, 7, 4, 6], **attrs}
    proto = model("TfIdfVectorizer", {"x": x}, opset=9, **attrs)
    want = ort.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0]
    assert want.any()
    for got in (run_graph(import_model(proto), {"x": x})["y0"], compiled(proto, {"x": x})[0]):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_tfidf_vectorizer_string_pool_is_refused():
    proto = model("TfIdfVectorizer", {"x": np.zeros((2, 3), np.int64)}, opset=9,
                  pool_strings=["a", "b"], ngram_counts=[0], ngram_indexes=[0, 1])
    with pytest.raises(ModelError, match="pool_strings: string tensors are not supported"):
        import_model(proto)
