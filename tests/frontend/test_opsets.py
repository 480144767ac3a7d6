"""Opset coverage of the importer: the opset 7..12 forms and the changes of opsets
22..28 import to the latest-form graph with the same meaning (the numpy reference of the
imported graph against ONNX Runtime, or against the ONNX definition where ORT lacks the
op), and what is not read is refused with a one-line error naming op, version and why."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from hidetc.errors import ModelError, ShapeError, UnsupportedOpError
from hidetc.frontend import import_model
from hidetc.frontend.onnx import versions
from hidetc.graph.ops import REGISTRY
from hidetc.graph.reference import run_graph

F, H, I64 = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.INT64
RNG = np.random.default_rng(0)


def model(nodes, inputs, outputs=("y",), inits=(), opset=13):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_empty_tensor_value_info(o) for o in outputs],
        [numpy_helper.from_array(np.asarray(a), n) for n, a in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


def one(op, attrs=None, inputs=(("x", F, [2, 3, 4]),), opset=13, inits=(), outputs=("y",),
        node_inputs=None):
    names = node_inputs if node_inputs is not None else \
        [n for n, _, _ in inputs] + [n for n, _ in inits]
    node = helper.make_node(op, names, list(outputs), name="n", **(attrs or {}))
    return model([node], inputs, outputs, inits, opset)


def ours(proto, feeds):
    return list(run_graph(import_model(proto), feeds).values())


def theirs(proto, feeds):
    session = ort.InferenceSession(proto.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def check(proto, feeds, rtol=1e-5, atol=1e-6):
    """Our reference of the imported graph equals ORT's outputs; returns the graph."""
    for a, b in zip(ours(proto, feeds), theirs(proto, feeds), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return import_model(proto)


def x(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def ops_of(graph):
    return [n.op for n in graph.nodes]


# -- the opset check and the per-op schema versions -----------------------------------

def test_opset_range_names_domain_and_opset():
    assert versions.OPSET_RANGE == (1, 28)
    for opset in (0, 29):
        with pytest.raises(ModelError, match=rf"^m: ai.onnx opset {opset} is not supported "
                                             r"\(supported: 1-28\)$"):
            import_model(one("Relu", opset=opset), source="m")


def test_schemas_older_than_opset7_forms_are_refused_with_what_differs():
    proto = one("Add", inputs=(("x", F, [2, 3]), ("z", F, [3])), opset=6)
    with pytest.raises(UnsupportedOpError, match=r"^m: node 'n' \(Add\): Add-6 \(opset 6\) is "
                       r"not supported \(attribute\(s\) 'axis', 'broadcast'\); hidetc reads "
                       r"Add from version 7 \(opset 7\+\)$"):
        import_model(proto, source="m")
    with pytest.raises(UnsupportedOpError, match=r"Cast-1 \(opset 5\) is not supported "
                                                 r"\(attribute\(s\) 'to' of another type\)"):
        import_model(one("Cast", {"to": "FLOAT"}, opset=5))
    with pytest.raises(UnsupportedOpError, match=r"Relu-1 .*'consumed_inputs'"):
        import_model(one("Relu", opset=5))


def test_ops_already_in_their_opset7_form_are_read_at_older_opsets():
    proto = one("Not", inputs=(("x", TensorProto.BOOL, [2, 3]),), opset=1)
    feeds = {"x": RNG.random((2, 3)) > 0.5}
    assert (ours(proto, feeds)[0] == ~feeds["x"]).all()
    check(one("Transpose", {"perm": [1, 0, 2]}, opset=1), {"x": x(2, 3, 4)})


def test_unreviewed_ops_keep_the_opset_13_to_21_forms(monkeypatch):
    monkeypatch.setattr(versions, "CHECKED", versions.CHECKED - {"Relu", "Swish"})
    check(one("Relu", opset=22), {"x": x(2, 3, 4)})     # Relu-14 is still in force at 22
    with pytest.raises(UnsupportedOpError, match=r"Relu-6 \(opset 12\) is not supported: "
                       r"hidetc reads Relu in its opset 13-21 forms only"):
        import_model(one("Relu", opset=12))
    import_model(one("Swish", opset=24))                  # born after 21: first version


def test_internal_catalogue_ops_are_not_onnx_ops():
    with pytest.raises(UnsupportedOpError, match="unsupported ops: ConvNHWC"):
        import_model(one("ConvNHWC", inputs=(("x", F, [1, 4, 4, 3]), ("w", F, [3, 3, 3, 3]))))


# -- opsets 7..12 ---------------------------------------------------------------------

@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 0}, {"axis": 2}, {"axis": -2}])
def test_softmax_before_13_coerces_to_2d(op, attrs):
    feeds = {"x": x(2, 3, 4)}
    proto = one(op, attrs, opset=11)
    graph = import_model(proto)
    axis = attrs.get("axis", 1) % 3
    rows = feeds["x"].reshape(int(np.prod(feeds["x"].shape[:axis])), -1)
    if op == "Softmax":
        expect = np.exp(rows) / np.exp(rows).sum(1, keepdims=True)
    elif op == "LogSoftmax":
        expect = rows - np.log(np.exp(rows).sum(1, keepdims=True))
    else:
        expect = (rows == rows.max(1, keepdims=True)).astype(np.float32)
    got = ours(proto, feeds)[0]
    np.testing.assert_allclose(got, expect.reshape(2, 3, 4), rtol=1e-5, atol=1e-6)
    if op != "Hardmax":
        check(proto, feeds)
    if axis == 2:
        assert ops_of(graph) == [op] and graph.nodes[0].attr("axis") == -1
    else:
        assert ops_of(graph) == ["Flatten", op, "Reshape"]


def test_softmax_before_13_rejects_an_axis_out_of_range():
    with pytest.raises(ModelError, match=r"axis 3 is out of range for an input of rank 3"):
        import_model(one("Softmax", {"axis": 3}, opset=12))


@pytest.mark.parametrize("attrs", [{"pads": [0, 1, 2, 1, 0, 0]},
                                   {"pads": [1, 0, 0, 0, 2, 1], "value": 1.5},
                                   {"pads": [0, 1, 1, 0, 1, 1], "mode": "reflect"},
                                   {"pads": [0, 1, 1, 0, 1, 2], "mode": "edge"}])
def test_pad_attributes_before_11(attrs):
    graph = check(one("Pad", attrs, opset=10), {"x": x(2, 3, 4)})
    (node,) = graph.nodes
    assert "pads" not in node.attr_dict and "value" not in node.attr_dict
    assert graph.constants[node.inputs[1]].tolist() == list(attrs["pads"])


@pytest.mark.parametrize("attrs", [{"min": -0.5, "max": 0.25}, {"min": 0.1}, {"max": -0.2}, {}])
def test_clip_attributes_before_11(attrs):
    graph = check(one("Clip", attrs, opset=10), {"x": x(2, 3, 4)})
    assert not graph.nodes[0].attr_dict


@pytest.mark.parametrize("attrs", [{"starts": [1, 0], "ends": [3, -1], "axes": [2, 0]},
                                   {"starts": [0, 1, -3], "ends": [1, 100, -1]}])
def test_slice_attributes_before_10(attrs):
    graph = check(one("Slice", attrs, opset=9), {"x": x(2, 3, 4)})
    assert not graph.nodes[0].attr_dict


@pytest.mark.parametrize("opset", [7, 9, 11])
def test_reduce_squeeze_unsqueeze_split_attributes_before_13(opset):
    nodes = [helper.make_node("ReduceSum", ["x"], ["a"], axes=[1], keepdims=1),
             helper.make_node("Squeeze", ["a"], ["b"], axes=[1]),
             helper.make_node("Unsqueeze", ["b"], ["c"], axes=[0]),
             helper.make_node("Split", ["c"], ["y", "z"], axis=2, split=[1, 3])]
    proto = model(nodes, [("x", F, [2, 3, 4])], ("y", "z"), opset=opset)
    check(proto, {"x": x(2, 3, 4)})


def _bn_inputs(channels=3):
    params = [np.abs(x(channels)) + 0.5, x(channels), x(channels), np.abs(x(channels)) + 0.1]
    return [(n, a) for n, a in zip(("s", "b", "m", "v"), params)]


@pytest.mark.parametrize("opset,attrs", [(7, {"spatial": 1, "momentum": 0.8}), (9, {}),
                                         (12, {"epsilon": 1e-3})])
def test_batchnorm_before_14_inference(opset, attrs):
    graph = check(one("BatchNormalization", attrs, opset=opset, inits=_bn_inputs()),
                  {"x": x(2, 3, 4)}, rtol=1e-4, atol=1e-5)
    assert "spatial" not in graph.nodes[0].attr_dict


def test_batchnorm_before_14_refuses_spatial_0_and_training_outputs():
    with pytest.raises(UnsupportedOpError, match=r"BatchNormalization-7 with spatial=0 "
                                                 r"\(per-activation statistics\)"):
        import_model(one("BatchNormalization", {"spatial": 0}, opset=8, inits=_bn_inputs()))
    proto = one("BatchNormalization", opset=9, inits=_bn_inputs(),
                outputs=("y", "mean", "var", "saved_mean", "saved_var"))
    with pytest.raises(UnsupportedOpError, match=r"BatchNormalization-9 with the mean/var "
                                                 r"outputs runs in training mode"):
        import_model(proto)


def test_dropout_ratio_attribute_before_12():
    feeds = {"x": x(2, 3, 4)}
    for opset in (7, 10):
        graph = check(one("Dropout", {"ratio": 0.3}, opset=opset), feeds)
        assert not graph.nodes[0].attr_dict
    for opset, version in ((9, 7), (11, 10)):
        with pytest.raises(UnsupportedOpError, match=rf"Dropout-{version}'s mask output is not "
                                                     r"supported \(undefined in inference"):
            import_model(one("Dropout", opset=opset, outputs=("y", "mask")))
    check(one("Dropout", opset=12, outputs=("y", "mask")), feeds)


def test_onehot_before_11_negative_indices_select_nothing():
    inputs = (("i", I64, [4]),)
    inits = (("d", np.array(3, np.int64)), ("v", np.array([0.0, 1.0], np.float32)))
    feeds = {"i": np.array([0, 2, -1, 1], np.int64)}
    old = ours(one("OneHot", {}, inputs, opset=10, inits=inits), feeds)[0]
    new = ours(one("OneHot", {}, inputs, opset=11, inits=inits), feeds)[0]
    assert old.tolist() == [[1, 0, 0], [0, 0, 1], [0, 0, 0], [0, 1, 0]]
    assert new[2].tolist() == [0, 0, 1]
    feeds = {"i": np.array([0, 2, 1, 1], np.int64)}
    check(one("OneHot", {"axis": 0}, inputs, opset=10, inits=inits), feeds)
    wide = (("d", np.array(200, np.int64)), inits[1])    # depth beyond int8: widened first
    proto = one("OneHot", {}, (("i", TensorProto.INT8, [2]),), opset=10, inits=wide)
    hot = ours(proto, {"i": np.array([-1, 100], np.int8)})[0]
    assert hot.shape == (2, 200) and hot[0].sum() == 0 and hot[1, 100] == 1


def test_gemm_and_elementwise_at_opset_7():
    inputs = (("a", F, [2, 3]), ("b", F, [3, 4]), ("c", F, [4]))
    check(one("Gemm", {"alpha": 0.5, "beta": 2.0}, inputs, opset=7),
          {"a": x(2, 3), "b": x(3, 4), "c": x(4)})
    inputs = (("a", TensorProto.BOOL, [2, 3, 4]), ("b", TensorProto.BOOL, [4]))
    feeds = {"a": RNG.random((2, 3, 4)) > 0.5, "b": RNG.random(4) > 0.5}
    for op in ("And", "Or", "Xor"):
        check(one(op, inputs=inputs, opset=7), feeds)


# -- opsets 22..28 --------------------------------------------------------------------

def test_type_only_changes_keep_the_graph():
    for op, attrs in (("Elu", {"alpha": 0.5}), ("Softplus", {}), ("Round", {}),
                      ("Celu", {"alpha": 2.0}), ("Transpose", {"perm": [2, 0, 1]})):
        new = import_model(one(op, attrs, opset=28))
        old = import_model(one(op, attrs, opset=21))
        assert new.nodes == old.nodes and new.types == old.types


@pytest.mark.parametrize("mode", [None, "DCR", "CRD"])
def test_spacetodepth_28_modes(mode):
    attrs = {"blocksize": 2} | ({"mode": mode} if mode else {})
    proto = one("SpaceToDepth", attrs, inputs=(("x", F, [1, 2, 4, 6]),), opset=28)
    graph = check(proto, {"x": x(1, 2, 4, 6)})
    if mode == "CRD":
        assert ops_of(graph) == ["Reshape", "Transpose", "Reshape"]
    else:
        assert ops_of(graph) == ["SpaceToDepth"] and "mode" not in graph.nodes[0].attr_dict
    with pytest.raises(ModelError, match="mode 'XYZ' is not DCR or CRD"):
        import_model(one("SpaceToDepth", {"blocksize": 2, "mode": "XYZ"},
                         inputs=(("x", F, [1, 2, 4, 6]),), opset=28))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mod_28_float_fmod_0_is_numpy_mod(dtype):
    elem = {np.float32: F, np.float64: TensorProto.DOUBLE}[dtype]
    a = np.array([7, -7, 7, -7, 0, -0.0, 0, 3, -3, 3, np.inf, 5, np.nan, 2.5, -2.5], dtype)
    b = np.array([3, 3, -3, -3, 3, 3, -3, np.inf, np.inf, -np.inf, 2, 0, 1, 0.75, 0.75], dtype)
    proto = one("Mod", inputs=(("a", elem, [15]), ("b", elem, [15])), opset=28)
    with np.errstate(invalid="ignore", divide="ignore"):
        expect = np.mod(a, b)
    got = ours(proto, {"a": a, "b": b})[0]
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, expect)
    assert (np.signbit(got) == np.signbit(expect))[~np.isnan(expect)].all()   # signed zeros
    ordinary = one("Mod", inputs=(("a", elem, [4]), ("b", elem, [4])), opset=28)
    check(ordinary, {"a": a[:4], "b": b[:4]})
    with pytest.raises(ShapeError, match="float Mod requires fmod=1"):
        import_model(one("Mod", inputs=(("a", elem, [3]), ("b", elem, [3])), opset=21))


def test_mod_28_integer_and_fmod_1_unchanged():
    inputs = (("a", I64, [4]), ("b", I64, [4]))
    feeds = {"a": np.array([7, -7, 7, -7]), "b": np.array([3, 3, -3, -3])}
    for attrs in ({}, {"fmod": 1}):
        graph = check(one("Mod", attrs, inputs, opset=28), feeds)
        assert ops_of(graph) == ["Mod"]


def test_range_27_stash_type():
    inputs = ()
    inits = (("s", np.array(2048, np.float16)), ("l", np.array(2056, np.float16)),
             ("d", np.array(0.5, np.float16)))     # float16 steps of 0.5 would stay at 2048
    graph = check(one("Range", inputs=inputs, inits=inits, opset=27), {})
    assert ops_of(graph) == ["Cast", "Cast", "Cast", "Range", "Cast"]
    (y,) = run_graph(graph, {}).values()
    np.testing.assert_array_equal(y, (2048 + 0.5 * np.arange(16, dtype=np.float32))
                                  .astype(np.float16))
    with pytest.raises(ShapeError, match="Range"):
        import_model(one("Range", {"stash_type": 0}, inputs=inputs, inits=inits, opset=27))
    graph = import_model(one("Range", {"stash_type": 0}, inputs=inputs, opset=27, inits=[
        (n, a.astype(np.float32)) for n, a in inits]))
    assert ops_of(graph) == ["Range"] and not graph.nodes[0].attr_dict


def test_cast_float8_attributes_kept_for_narrow_targets_only():
    graph = import_model(one("Cast", {"to": F, "saturate": 1, "round_mode": "up"}, opset=24))
    assert graph.nodes[0].attr_dict == {"to": "float32"}
    graph = import_model(one("Cast", {"to": TensorProto.FLOAT8E8M0, "round_mode": "down"},
                             opset=24))
    assert graph.nodes[0].attr_dict == {"to": "float8_e8m0fnu", "round_mode": "down"}
    graph = import_model(one("Cast", {"to": F}, inputs=(("x", TensorProto.FLOAT4E2M1, [4]),),
                             opset=23))
    assert graph.types["x"].dtype == "float4_e2m1fn"
    with pytest.raises(ModelError, match="unsupported element type FLOAT6E2M3"):
        import_model(one("Cast", {"to": F}, inputs=(("x", TensorProto.FLOAT6E2M3, [4]),),
                         opset=28))


def test_bitshift_28_signed_semantics():
    a = np.array([1, -8, 64, -1, 5, -128], np.int8)
    s = np.array([1, 1, 9, 7, -1, 8], np.int8)
    inputs = (("a", TensorProto.INT8, [6]), ("s", TensorProto.INT8, [6]))
    left = ours(one("BitShift", {"direction": "LEFT"}, inputs, opset=28), {"a": a, "s": s})[0]
    right = ours(one("BitShift", {"direction": "RIGHT"}, inputs, opset=28), {"a": a, "s": s})[0]
    assert left.tolist() == [2, -16, 0, -128, 0, 0]
    assert right.tolist() == [0, -4, 0, -1, 0, -1]


@pytest.mark.parametrize("shape,axis,dtype", [([2, 3, 4], -1, np.float32),
                                              ([2, 3, 4], 1, np.float32),
                                              ([4, 6], 0, np.float32),
                                              ([2, 8], -1, np.float16)])
def test_rms_normalization_23(shape, axis, dtype):
    elem = F if dtype == np.float32 else H
    inputs = (("x", elem, shape), ("w", elem, shape[axis % len(shape):]))
    proto = one("RMSNormalization", {"axis": axis, "epsilon": 1e-3}, inputs, opset=23)
    feeds = {"x": x(*shape, dtype=dtype), "w": x(*shape[axis % len(shape):], dtype=dtype)}
    xu = feeds["x"].astype(np.float32)
    axes = tuple(range(axis % len(shape), len(shape)))
    normalized = xu / np.sqrt(np.mean(xu * xu, axis=axes, keepdims=True) + np.float32(1e-3))
    expect = normalized.astype(dtype) * feeds["w"]
    got = ours(proto, feeds)[0]
    assert got.dtype == dtype
    tol = 1e-5 if dtype == np.float32 else 2e-3
    np.testing.assert_allclose(got, expect, rtol=tol, atol=tol)
    if dtype == np.float32:
        check(proto, feeds)
    graph = import_model(proto)
    assert "ReduceMean" in ops_of(graph) and graph.nodes[-1].outputs == ("y",)


def test_swish_24_and_swiglu_28():
    feeds = {"x": x(2, 5)}
    for alpha in (1.0, 0.5):
        proto = one("Swish", {"alpha": alpha}, inputs=(("x", F, [2, 5]),), opset=24)
        graph = check(proto, feeds)
        assert ops_of(graph) == (["Sigmoid", "Mul"] if alpha == 1.0 else
                                 ["Mul", "Sigmoid", "Mul"])
    inputs = (("a", F, [2, 5]), ("b", F, [2, 5]))
    feeds = {"a": x(2, 5), "b": x(2, 5)}
    got = ours(one("SwiGLU", {"alpha": 1.5}, inputs, opset=28), feeds)[0]
    a = feeds["a"]
    np.testing.assert_allclose(got, a / (1 + np.exp(-1.5 * a)) * feeds["b"], rtol=1e-5)
    with pytest.raises(ModelError, match=r"inputs A \[2, 5\] and B \[5\] must have the same"):
        import_model(one("SwiGLU", inputs=(("a", F, [2, 5]), ("b", F, [5])), opset=28))


def _tensor_scatter_spec(past, update, write, axis, mode):
    """The TensorScatter-24 pseudocode of the ONNX spec, loop for loop."""
    out = past.copy()
    size, length = past.shape[axis], update.shape[axis]
    for prefix in np.ndindex(past.shape[:axis]):
        for s in range(length):
            p = (0 if write is None else int(write[prefix[0]])) + s
            p = p % size if mode == "circular" else p
            out[(*prefix, p)] = update[(*prefix, s)]
    return out


@pytest.mark.parametrize("mode,axis,shape,length,write", [
    ("linear", -2, [2, 3, 6, 4], 2, [0, 3]), ("circular", -2, [2, 3, 6, 4], 3, [4, 5]),
    ("linear", 1, [3, 5, 2], 1, [4, 0, 2]), ("circular", 2, [2, 3, 4], 4, [1, 7]),
    ("linear", -2, [2, 5, 3], 2, None), ("circular", -1, [2, 4], 4, [2, 0])])
def test_tensor_scatter_24(mode, axis, shape, length, write):
    """The KV-cache update read as Where(valid, GatherElements(update, ...), past):
    against ONNX Runtime and the spec's loops (prefill without write_indices, decode
    with them, a circular write wrapping past the end, a whole-length update)."""
    ushape = list(shape)
    ushape[axis] = length
    inputs = [("past", F, shape), ("update", F, ushape)]
    feeds = {"past": x(*shape), "update": x(*ushape)}
    if write is not None:
        inputs.append(("write", I64, [shape[0]]))
        feeds["write"] = np.array(write, np.int64)
    proto = one("TensorScatter", {"mode": mode, "axis": axis}, inputs, opset=24)
    graph = check(proto, feeds, rtol=0, atol=0)
    assert "GatherElements" in ops_of(graph) and "TensorScatter" not in ops_of(graph)
    got = ours(proto, feeds)[0]
    expect = _tensor_scatter_spec(feeds["past"], feeds["update"], write, axis % len(shape),
                                  mode)
    np.testing.assert_array_equal(got, expect)


def test_tensor_scatter_24_refuses_mismatched_shapes_and_the_batch_axis():
    def refused(shape, ushape, attrs, match):
        with pytest.raises(ModelError, match=match):
            import_model(one("TensorScatter", attrs, (("past", F, shape), ("update", F, ushape)),
                             opset=24))
    refused([2, 4, 3], [2, 5, 3], {"axis": 1}, r"update \[2, 5, 3\] must match past_cache "
            r"\[2, 4, 3\] except along axis 1, where it may be no longer")
    refused([2, 4, 3], [2, 2, 4], {"axis": 1}, r"must match past_cache")
    refused([2, 4, 3], [2, 2, 3], {"axis": 0}, r"axis 0 must name a non-batch dimension")
    refused([2, 4, 3], [2, 2, 3], {"axis": 1, "mode": "ring"}, r"mode 'ring' is not linear")


needs_resize = pytest.mark.skipif("Resize" not in REGISTRY, reason="no Resize in the catalogue")


@needs_resize
@pytest.mark.parametrize("op,opset,mode,scales", [
    ("Upsample", 7, "nearest", [1, 1, 2, 3]), ("Upsample", 8, "linear", [1, 1, 2, 1.5]),
    ("Upsample", 9, "nearest", [1, 1, 3, 2]), ("Upsample", 9, "linear", [1, 1, 2.5, 2]),
    ("Resize", 10, "nearest", [1, 1, 0.5, 0.75]), ("Resize", 10, "linear", [1, 1, 1.5, 0.5])])
def test_upsample_and_resize_10_as_resize(op, opset, mode, scales):
    scales = np.array(scales, np.float32)
    if opset < 9:
        proto = one(op, {"mode": mode, "scales": scales.tolist()},
                    inputs=(("x", F, [1, 2, 4, 4]),), opset=opset)
    else:
        proto = one(op, {"mode": mode}, inputs=(("x", F, [1, 2, 4, 4]),), opset=opset,
                    inits=(("s", scales),))
    graph = check(proto, {"x": x(1, 2, 4, 4)})
    (node,) = graph.nodes
    assert node.op == "Resize" and node.inputs[1] == ""
    assert node.attr("coordinate_transformation_mode") == "asymmetric"


@needs_resize
def test_upsample_nearest_mixed_scales_refused():
    proto = one("Upsample", {"mode": "nearest"}, inputs=(("x", F, [1, 2, 4, 4]),), opset=9,
                inits=(("s", np.array([1, 1, 2, 0.5], np.float32)),))
    with pytest.raises(UnsupportedOpError, match=r"Upsample-9 nearest with scales \[1.0, 1.0, "
                                                 r"2.0, 0.5\] both enlarging and shrinking"):
        import_model(proto)
