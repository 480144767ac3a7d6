"""Elementwise ops against ONNX Runtime: unary math/activations, binary broadcasting,
variadic, comparisons/logic, Where, Clip, PRelu, Cast, and their shape errors."""
import numpy as np
import pytest
from onnx import helper

from hidetc.errors import ShapeError
from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.ops import REGISTRY, OpKind
from tests.graph.ort_harness import check_op, rand

# op -> (low, high) input range
UNARY_FLOAT = {
    "Relu": (-2, 2), "Neg": (-2, 2), "Abs": (-2, 2), "Sign": (-2, 2), "Floor": (-3, 3),
    "Ceil": (-3, 3), "Round": (-3, 3), "Reciprocal": (0.5, 3), "Sqrt": (0.01, 9),
    "Exp": (-5, 5), "Log": (0.01, 9), "Tanh": (-4, 4), "Sigmoid": (-8, 8), "Erf": (-3, 3),
    "Sin": (-3, 3), "Cos": (-3, 3), "Tan": (-1.2, 1.2), "Asin": (-0.99, 0.99),
    "Acos": (-0.99, 0.99), "Atan": (-3, 3), "Sinh": (-3, 3), "Cosh": (-3, 3),
    "Asinh": (-3, 3), "Acosh": (1.01, 5), "Atanh": (-0.95, 0.95), "Softplus": (-5, 5),
    "Softsign": (-3, 3), "Mish": (-4, 4), "Gelu": (-4, 4), "LeakyRelu": (-2, 2),
    "Elu": (-2, 2), "Celu": (-2, 2), "Selu": (-2, 2), "ThresholdedRelu": (-2, 2),
    "HardSigmoid": (-4, 4), "HardSwish": (-5, 5), "Shrink": (-2, 2),
}


@pytest.mark.parametrize("op", sorted(UNARY_FLOAT))
def test_unary_float32(op):
    low, high = UNARY_FLOAT[op]
    x = rand(2, 3, 17, low=low, high=high)
    if op == "Round":
        x[0, 0, :4] = [0.5, 1.5, -0.5, 2.5]  # ties round to even
    check_op(op, [x])


@pytest.mark.parametrize("op", ["Relu", "Neg", "Abs", "Sqrt", "Exp", "Sigmoid", "Tanh"])
def test_unary_float64_and_float16(op):
    x = rand(4, 9, low=0.1, high=3)
    check_op(op, [x.astype(np.float64)], rtol=1e-12, atol=1e-12)
    check_op(op, [x.astype(np.float16)], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("op, attrs", [
    ("LeakyRelu", {"alpha": 0.2}), ("Elu", {"alpha": 0.5}), ("Celu", {"alpha": 2.0}),
    ("Selu", {"alpha": 1.5, "gamma": 0.8}), ("ThresholdedRelu", {"alpha": 0.3}),
    ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("Gelu", {"approximate": "tanh"}),
    ("Shrink", {"bias": 0.3, "lambd": 0.7}),
])
def test_unary_attributes(op, attrs):
    check_op(op, [rand(3, 11, low=-3, high=3)], attrs)


@pytest.mark.parametrize("op, dtype", [
    ("Relu", np.int32), ("Relu", np.int8), ("Neg", np.int64), ("Abs", np.int32),
    ("Sign", np.int64), ("BitwiseNot", np.int32), ("BitwiseNot", np.uint8),
])
def test_unary_int(op, dtype):
    low = 0 if np.dtype(dtype).kind == "u" else -50
    check_op(op, [rand(3, 7, dtype=dtype, low=low, high=50)])


def test_not_isnan_isinf():
    check_op("Not", [rand(4, 5, dtype=np.bool_)])
    x = np.array([0.0, np.nan, np.inf, -np.inf, 1.0, -2.0], dtype=np.float32)
    check_op("IsNaN", [x])
    for neg, pos in [(1, 1), (0, 1), (1, 0)]:
        check_op("IsInf", [x], {"detect_negative": neg, "detect_positive": pos})


BROADCAST_SHAPES = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((3, 1), (1, 5)), ((), (2, 3)),
                    ((2, 1, 4), (3, 1))]


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", BROADCAST_SHAPES)
def test_arith_broadcast_float(op, shapes):
    a = rand(*shapes[0], seed=1)
    b = rand(*shapes[1], low=0.5, high=2.0, seed=2)
    check_op(op, [a, b])


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_arith_int(op, dtype):
    a = rand(4, 6, dtype=dtype, low=-40, high=40, seed=3)
    b = rand(6, dtype=dtype, low=1, high=7, seed=4) * np.where(np.arange(6) % 2, 1, -1)
    check_op(op, [a, b.astype(dtype)])  # Div truncates toward zero


def test_pow():
    check_op("Pow", [rand(3, 5, low=0.1, high=3), rand(5, low=-2, high=2)])
    check_op("Pow", [rand(3, 5, low=0.1, high=3), np.array(2.0, np.float32)])
    check_op("Pow", [rand(3, 5, low=0.1, high=3), np.array([2, 3, 1, 0, 2], np.int64)])
    check_op("Pow", [rand(4, dtype=np.int64, low=-5, high=5), np.array(3, np.int64)])


def test_mod():
    a = rand(3, 8, dtype=np.int32, low=-20, high=20)
    b = np.array([3, -3, 5, -7, 2, 9, -1, 4], np.int32)
    check_op("Mod", [a, b], {"fmod": 0})
    check_op("Mod", [a, b], {"fmod": 1})
    check_op("Mod", [rand(3, 8, low=-5, high=5), rand(8, low=0.5, high=2)], {"fmod": 1})


def test_bitshift_and_bitwise():
    a = rand(3, 4, dtype=np.uint32, low=0, high=1000)
    s = np.array([0, 1, 3, 5], np.uint32)
    check_op("BitShift", [a, s], {"direction": "LEFT"})
    check_op("BitShift", [a, s], {"direction": "RIGHT"})
    x, y = rand(3, 4, dtype=np.int32, low=-99, high=99), rand(4, dtype=np.int32, low=0, high=99)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        check_op(op, [x, y])


@pytest.mark.parametrize("op", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_compare(op, dtype):
    a = rand(3, 5, dtype=dtype, low=-3, high=3, seed=5)
    b = rand(5, dtype=dtype, low=-3, high=3, seed=6)
    if dtype == np.float32:
        a[0] = b  # some exact ties
    check_op(op, [a, b])


@pytest.mark.parametrize("op", ["And", "Or", "Xor"])
def test_logic(op):
    check_op(op, [rand(3, 4, dtype=np.bool_, seed=1), rand(4, dtype=np.bool_, seed=2)])


def test_equal_bool():
    check_op("Equal", [rand(3, 4, dtype=np.bool_, seed=1), rand(4, dtype=np.bool_, seed=2)])


@pytest.mark.parametrize("op", ["Max", "Min", "Sum", "Mean"])
def test_variadic(op):
    check_op(op, [rand(2, 3, 4, seed=1), rand(4, seed=2), rand(3, 1, seed=3)])
    check_op(op, [rand(5, seed=4)])
    if op in ("Max", "Min"):
        check_op(op, [rand(3, 4, dtype=np.int32, low=-9, high=9, seed=5),
                      rand(4, dtype=np.int32, low=-9, high=9, seed=6)])


def test_where():
    check_op("Where", [rand(3, 1, 5, dtype=np.bool_), rand(4, 5, seed=1), rand(3, 4, 1, seed=2)])
    check_op("Where", [rand(6, dtype=np.bool_), rand(6, dtype=np.int64, low=0, high=9),
                       np.array(-1, np.int64)])


def test_clip():
    x = rand(4, 7, low=-3, high=3)
    low, high = np.array(-1.0, np.float32), np.array(1.5, np.float32)
    check_op("Clip", [x, low, high], consts=())
    check_op("Clip", [x, low], consts=())
    check_op("Clip", [x, None, high], consts=())
    check_op("Clip", [x])
    check_op("Clip", [x, high, low], consts=())  # min > max: everything becomes max
    xi = rand(4, 7, dtype=np.int32, low=-9, high=9)
    check_op("Clip", [xi, np.array(-2, np.int32), np.array(5, np.int32)], consts=())


def test_prelu():
    check_op("PRelu", [rand(2, 3, 4, 4), rand(3, 1, 1, seed=9)])
    check_op("PRelu", [rand(2, 5), rand(5, seed=9)])


CASTS = [(np.float32, np.int32), (np.float32, np.int64), (np.float32, np.float16),
         (np.float32, np.float64), (np.float32, np.bool_), (np.int64, np.float32),
         (np.int32, np.int8), (np.bool_, np.float32), (np.float16, np.float32),
         (np.int64, np.uint8)]


@pytest.mark.parametrize("src, dst", CASTS)
def test_cast(src, dst):
    x = rand(3, 9, low=-100, high=100).astype(src) if src != np.bool_ else rand(
        3, 9, dtype=np.bool_)
    if src == np.int64 and dst == np.uint8:
        x = np.abs(x)
    to = onnx_type(dst)
    check_op("Cast", [x], {"to": to})
    check_op("Cast", [x], {"to": to}, opset=13)


def onnx_type(dtype):
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def test_castlike_becomes_cast():
    x = rand(3, 4, low=-9, high=9)
    out = check_op("CastLike", [x, np.zeros(1, np.int32)], consts=(1,))
    assert out[0].dtype == np.int32


def node(op, n_in=2, **attrs):
    return Node.make(op, [f"i{k}" for k in range(n_in)], ["out"], name=f"/layer1/{op}", **attrs)


def test_broadcast_error_message():
    types = [TensorType("float32", (3, 4)), TensorType("float32", (5,))]
    with pytest.raises(ShapeError) as info:
        infer_node(node("Add"), types)
    assert str(info.value) == ("node '/layer1/Add' (Add): input 1 has shape [5], "
                               "not broadcastable with [3,4]")


def test_dtype_errors():
    types = [TensorType("float32", (3,)), TensorType("int64", (3,))]
    with pytest.raises(ShapeError, match=r"\(Mul\): input 1 has dtype int64, expected float32"):
        infer_node(node("Mul"), types)
    with pytest.raises(ShapeError, match=r"\(Sqrt\): input 0 has dtype int32, expected one of"):
        infer_node(node("Sqrt", 1), [TensorType("int32", (3,))])
    with pytest.raises(ShapeError, match="expects 2 inputs, got 1"):
        infer_node(node("Add", 1), [TensorType("float32", (3,))])
    with pytest.raises(ShapeError, match="float Mod requires fmod=1"):
        infer_node(node("Mod"), [TensorType("float32", (3,))] * 2)
    with pytest.raises(ShapeError, match="input 0 has dtype float32, expected one of bool"):
        infer_node(node("Where", 3), [TensorType("float32", (3,))] * 3)
    with pytest.raises(ShapeError, match="not a supported dtype"):
        infer_node(node("Cast", 1, to="string"), [TensorType("float32", (3,))])
    with pytest.raises(ShapeError, match="not broadcastable to"):
        infer_node(node("PRelu"), [TensorType("float32", (3,)), TensorType("float32", (2, 3))])


def test_kinds():
    for op in ["Relu", "Add", "Where", "Cast", "Clip", "Equal", "Not", "Max", "Erf", "PRelu"]:
        assert REGISTRY[op].kind is OpKind.BIJECTIVE
