"""The quantization decompositions (frontend/onnx/quantization.py): the imported graph run
by the numpy oracle against onnx's ReferenceEvaluator (or numpy where the reference does
not implement the spec's per-row zero points), a few models compiled for the CPU, and
the one-line errors for bad scale shapes and types."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import hidetc.tools.onnx_backend as backend
from hidetc.errors import ModelError
from hidetc.frontend import import_model
from hidetc.graph.reference import run_graph

F, U8, I8, I32 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32
NP = {F: np.float32, U8: np.uint8, I8: np.int8, I32: np.int32, TensorProto.INT16: np.int16,
      TensorProto.UINT16: np.uint16}


def model(op, inputs, n_out=1, opset=21, inits=(), **attrs):
    """A one-node model; inputs: (name, elem type, shape), "" for an omitted input."""
    names = [name for name, _, _ in inputs]
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], name="q", **attrs)
    given = {i.name for i in inits}
    ins = [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs if n and n not in given]
    outs = [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)]
    graph = helper.make_graph([node], "g", ins, outs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def feeds(inputs, rng, values=None):
    values = values or {}
    out = {}
    for name, elem, shape in inputs:
        if not name:
            continue
        if name in values:
            out[name] = np.asarray(values[name], dtype=NP[elem]).reshape(shape)
        elif elem == F:
            out[name] = rng.uniform(-4, 4, shape).astype(np.float32)
        else:
            info = np.iinfo(NP[elem])
            out[name] = rng.integers(info.min, info.max, shape, endpoint=True).astype(NP[elem])
    return out


def oracle(proto, inputs):
    """Our imported graph's outputs (numpy oracle) and the onnx reference's."""
    ours = run_graph(import_model(proto), inputs)
    theirs = ReferenceEvaluator(proto).run(None, inputs)
    return list(ours.values()), theirs


def assert_same(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        if a.dtype.itemsize == 1:   # narrow floats: compare the encodings (NaN included)
            np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
        else:
            np.testing.assert_array_equal(a, b)


SCALE = {"s": np.float32(0.37)}
QUANTIZE = [
    # (inputs, attrs, fixed values)
    ([("x", F, [3, 4]), ("s", F, [])], {}, SCALE),
    ([("x", F, [3, 4]), ("s", F, []), ("z", I8, [])], {}, SCALE),
    ([("x", F, [3, 4]), ("s", F, [1]), ("z", U8, [1])], {}, {"s": [0.01], "z": [128]}),
    ([("x", F, [2, 3, 4]), ("s", F, [3]), ("z", U8, [3])], {"axis": 1},
     {"s": [0.02, 0.5, 0.03]}),
    ([("x", F, [2, 3, 4]), ("s", F, [4]), ("z", I8, [4])], {"axis": -1},
     {"s": [0.02, 0.5, 0.03, 1.0]}),
    ([("x", F, [3, 7]), ("s", F, [3, 3]), ("z", I8, [3, 3])], {"axis": 1, "block_size": 3},
     {"s": np.linspace(0.01, 0.2, 9)}),
    ([("x", F, [6, 2]), ("s", F, [2, 2])], {"axis": 0, "block_size": 3},
     {"s": [0.1, 0.2, 0.3, 0.4]}),
    ([("x", F, [3, 4]), ("s", F, [])], {"output_dtype": TensorProto.INT16}, {"s": 1e-4}),
    ([("x", F, [3, 4]), ("s", F, []), ("z", TensorProto.UINT16, [])], {}, {"s": 1e-4}),
    ([("x", I32, [3, 4]), ("s", F, []), ("z", I8, [])], {}, {"s": 1e9}),
]


@pytest.mark.parametrize("inputs, attrs, values", QUANTIZE)
def test_quantize_linear_matches_reference(inputs, attrs, values):
    proto = model("QuantizeLinear", inputs, **attrs)
    assert_same(*oracle(proto, feeds(inputs, np.random.default_rng(0), values)))


def test_quantize_rounds_half_to_even_and_saturates():
    inputs = [("x", F, [10]), ("s", F, []), ("z", U8, [])]
    x = [0.5, 1.5, 2.5, -0.5, -1.5, 3.4999, 1e6, -1e6, 253.5, 254.5]
    got, want = oracle(model("QuantizeLinear", inputs),
                       feeds(inputs, None, {"x": x, "s": 1.0, "z": 1}))
    assert_same(got, want)
    assert got[0].tolist() == [1, 3, 3, 1, 0, 4, 255, 0, 255, 255]


NARROW = [TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2, TensorProto.FLOAT4E2M1,
          TensorProto.INT4, TensorProto.UINT4, TensorProto.INT2, TensorProto.UINT2]


@pytest.mark.parametrize("elem", NARROW)
@pytest.mark.parametrize("saturate", [0, 1])
def test_quantize_to_narrow_types_matches_reference(elem, saturate):
    zero = numpy_helper.from_array(np.array([1, 0, 2], dtype=helper.tensor_dtype_to_np_dtype(
        elem)), "z")   # nonzero zero points: the float8 reference ignores them
    inputs = [("x", F, [3, 4]), ("s", F, [3]), ("z", elem, [3])]
    proto = model("QuantizeLinear", inputs, inits=[zero], axis=0, saturate=saturate)
    x = np.array([0.0, 0.5, 1.5, 2.5, -0.5, -3.2, 7.9, 1e4, -1e4, 0.26, 300.0, -2.0])
    data = feeds(inputs[:2], None, {"x": x, "s": [1.0, 0.5, 0.01]})
    assert_same(*oracle(proto, data))


@pytest.mark.parametrize("elem", NARROW)
def test_dequantize_narrow_types_matches_reference(elem):
    np_type = helper.tensor_dtype_to_np_dtype(elem)
    values = np.array([0.0, 1.0, -1.0, 0.5, 1.5, -2.0], dtype=np.float32).astype(np_type)
    zero = np.array(0 if elem in (TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2) else 1,
                    dtype=np.float32).astype(np_type)
    inits = [numpy_helper.from_array(values.reshape(2, 3), "x"),
             numpy_helper.from_array(zero, "z")]
    inputs = [("x", elem, [2, 3]), ("s", F, []), ("z", elem, [])]
    proto = model("DequantizeLinear", inputs, inits=inits)
    assert_same(*oracle(proto, {"s": np.float32(0.75)}))


DEQUANTIZE = [
    ([("x", U8, [3, 4]), ("s", F, []), ("z", U8, [])], {}, SCALE),
    ([("x", I8, [3, 4]), ("s", F, [])], {}, SCALE),
    ([("x", I8, [2, 3, 4]), ("s", F, [3]), ("z", I8, [3])], {"axis": 1},
     {"s": [0.02, 0.5, 0.03]}),
    ([("x", U8, [3, 7]), ("s", F, [3, 3]), ("z", U8, [3, 3])], {"axis": 1, "block_size": 3},
     {"s": np.linspace(0.01, 0.2, 9)}),
    ([("x", TensorProto.INT16, [3, 4]), ("s", F, [])], {}, {"s": 1e-3}),
    ([("x", I32, [3, 4]), ("s", F, []), ("z", I32, [])], {}, {"s": 1e-3, "z": 7}),
]


@pytest.mark.parametrize("inputs, attrs, values", DEQUANTIZE)
def test_dequantize_linear_matches_reference(inputs, attrs, values):
    proto = model("DequantizeLinear", inputs, **attrs)
    assert_same(*oracle(proto, feeds(inputs, np.random.default_rng(1), values)))


@pytest.mark.parametrize("x", [[0.0, 2.0, -3.5, 7.25, -0.1, 1.0], [1.0, 2.0, 3.0, 0.5, 9.0, 4.0],
                               [-1.0, -2.0, -3.0, -0.5, -9.0, -4.0], [0.0] * 6])
def test_dynamic_quantize_linear_matches_reference(x):
    inputs = [("x", F, [2, 3])]
    proto = model("DynamicQuantizeLinear", inputs, n_out=3, opset=11)
    assert_same(*oracle(proto, feeds(inputs, None, {"x": x})))


@pytest.mark.parametrize("k, dt", [(5, U8), (300, I8)])   # float32 and float64 products
def test_matmul_integer_matches_reference(k, dt):
    inputs = [("a", dt, [2, 3, k]), ("b", U8, [k, 4]), ("az", dt, []), ("bz", U8, [])]
    proto = model("MatMulInteger", inputs, opset=10)
    assert_same(*oracle(proto, feeds(inputs, np.random.default_rng(2))))


EXTREME = {"a": np.full(3 * 301, 255), "b": np.full(301 * 4, -128), "az": 0, "bz": 127}
EXTREME_INPUTS = [("a", U8, [3, 301]), ("b", I8, [301, 4]), ("az", U8, []), ("bz", I8, [])]


def test_matmul_integer_past_float32_exactness_is_exact():
    """|sum| = 301 * 255 * 255 > 2^24, its partial sums odd: float32 would round them."""
    proto = model("MatMulInteger", EXTREME_INPUTS, opset=10)
    got, want = oracle(proto, feeds(EXTREME_INPUTS, None, EXTREME))
    assert_same(got, want)
    assert (got[0] == -301 * 255 * 255).all()


def test_matmul_integer_per_row_and_column_zero_points():
    inputs = [("a", U8, [3, 5]), ("b", I8, [5, 4]), ("az", U8, [3]), ("bz", I8, [4])]
    data = feeds(inputs, np.random.default_rng(3))
    (got,) = run_graph(import_model(model("MatMulInteger", inputs, opset=10)), data).values()
    a = data["a"].astype(np.int32) - data["az"].astype(np.int32)[:, None]
    b = data["b"].astype(np.int32) - data["bz"].astype(np.int32)[None, :]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a @ b)


@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 1, 1, 1], "strides": [2, 1]},
                                   {"auto_pad": "SAME_UPPER", "group": 2}])
def test_conv_integer_matches_reference(attrs):
    inputs = [("x", U8, [1, 4, 5, 5]), ("w", I8, [4, 4 // attrs.get("group", 1), 3, 3]),
              ("xz", U8, []), ("wz", I8, [4])]
    proto = model("ConvInteger", inputs, opset=10, **attrs)
    assert_same(*oracle(proto, feeds(inputs, np.random.default_rng(4))))


@pytest.mark.parametrize("a, b, y", [(U8, U8, U8), (I8, I8, I8), (I8, U8, U8)])
def test_qlinear_matmul_matches_reference(a, b, y):
    inputs = [("a", a, [2, 3, 6]), ("as", F, []), ("az", a, []), ("b", b, [6, 4]),
              ("bs", F, []), ("bz", b, []), ("ys", F, []), ("yz", y, [])]
    values = {"as": 0.0066, "bs": 0.00705, "ys": 0.0107}
    proto = model("QLinearMatMul", inputs)
    assert_same(*oracle(proto, feeds(inputs, np.random.default_rng(5), values)))


@pytest.mark.parametrize("bias", [False, True])
def test_qlinear_conv_matches_reference(bias):
    inputs = [("x", U8, [1, 2, 5, 5]), ("xs", F, []), ("xz", U8, []), ("w", I8, [3, 2, 3, 3]),
              ("ws", F, [3]), ("wz", I8, [3]), ("ys", F, []), ("yz", U8, [])]
    if bias:
        inputs.append(("B", I32, [3]))
    values = {"xs": 0.00369, "ws": [0.003, 0.004, 0.005], "wz": [0, 0, 0], "ys": 0.0078,
              "yz": 120, "B": [-300, 0, 2000]}
    proto = model("QLinearConv", inputs, opset=10, pads=[1, 1, 1, 1])
    assert_same(*oracle(proto, feeds(inputs, np.random.default_rng(6), values)))


@pytest.mark.parametrize("op, inputs, attrs, message", [
    ("QuantizeLinear", [("x", F, [3, 4]), ("s", F, [3])], {"axis": 1}, "expected a scalar or [4]"),
    ("QuantizeLinear", [("x", F, [3, 4]), ("s", F, []), ("z", I8, [])],
     {"output_dtype": TensorProto.UINT8}, "differs from y_zero_point"),
    ("QuantizeLinear", [("x", F, [3, 4]), ("s", F, [3, 1])], {"axis": 1, "block_size": 2},
     "blocked quantization"),
    ("DequantizeLinear", [("x", U8, [3, 4]), ("s", F, []), ("z", I8, [])], {},
     "expected x's type uint8"),
    ("ConvInteger", [("x", U8, [1, 2, 5, 5]), ("w", U8, [3, 2, 3, 3]), ("", U8, []),
                     ("wz", U8, [2])], {}, "expected a scalar or [3]"),
])
def test_bad_models_are_one_line_model_errors(op, inputs, attrs, message):
    with pytest.raises(ModelError) as info:
        import_model(model(op, inputs, **attrs))
    text = str(info.value)
    assert "\n" not in text and "node 'q'" in text and message in text


def compiled(proto, inputs):
    with backend.prepare(proto, "CPU") as rep:
        return list(rep.run(inputs))


@pytest.mark.parametrize("op, inputs, attrs, values", [
    ("QuantizeLinear", QUANTIZE[3][0], QUANTIZE[3][1], QUANTIZE[3][2]),
    ("DequantizeLinear", DEQUANTIZE[3][0], DEQUANTIZE[3][1], DEQUANTIZE[3][2]),
    ("QLinearConv", [("x", U8, [1, 2, 5, 5]), ("xs", F, []), ("xz", U8, []),
                     ("w", U8, [3, 2, 3, 3]), ("ws", F, []), ("wz", U8, []), ("ys", F, []),
                     ("yz", U8, [])], {"pads": [1, 1, 1, 1]},
     {"xs": 0.00369, "ws": 0.004, "ys": 0.0078}),
    ("MatMulInteger", [("a", U8, [3, 300]), ("b", I8, [300, 4]), ("az", U8, [])], {}, {}),
    ("MatMulInteger", EXTREME_INPUTS, {}, EXTREME),
    # a 1-D ConvInteger (speech models' feature extractors) lifted to the 2-D kernels
    ("ConvInteger", [("x", U8, [2, 4, 17]), ("w", I8, [6, 2, 3]), ("xz", U8, [])],
     {"pads": [1, 2], "strides": [2], "group": 2}, {}),
])
def test_compiled_on_cpu_matches_reference(op, inputs, attrs, values):
    opset = 21 if op in ("QuantizeLinear", "DequantizeLinear") else 10
    proto = model(op, inputs, opset=opset, **attrs)
    data = feeds(inputs, np.random.default_rng(7), values)
    assert_same(compiled(proto, data), ReferenceEvaluator(proto).run(None, data))
