"""MatMul, Gemm, Softmax, LogSoftmax, LayerNormalization, InstanceNormalization and
BatchNormalization against ONNX Runtime, plus their shape errors."""
import numpy as np
import pytest

from hidetc.errors import ShapeError
from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.ops import REGISTRY, OpKind
from tests.graph.ort_harness import check_op, rand

MATMUL_SHAPES = [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)),
                 ((2, 3, 4), (4, 5)), ((3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 6)),
                 ((1, 7), (7, 1)), ((2, 3, 4), (4,)), ((4,), (2, 4, 3))]


@pytest.mark.parametrize("a, b", MATMUL_SHAPES)
def test_matmul(a, b):
    check_op("MatMul", [rand(*a, seed=1), rand(*b, seed=2)])


def test_matmul_int_and_double():
    check_op("MatMul", [rand(3, 4, dtype=np.int32, low=-9, high=9),
                        rand(4, 2, dtype=np.int32, low=-9, high=9)])
    check_op("MatMul", [rand(3, 4).astype(np.float64), rand(4, 2).astype(np.float64)],
             rtol=1e-12)


@pytest.mark.parametrize("trans_a", [0, 1])
@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("c_shape", [None, (5,), (3, 1), (1, 5), (3, 5), ()])
def test_gemm(trans_a, trans_b, c_shape):
    a = rand(*((4, 3) if trans_a else (3, 4)), seed=1)
    b = rand(*((5, 4) if trans_b else (4, 5)), seed=2)
    inputs = [a, b] + ([] if c_shape is None else [rand(*c_shape, seed=3)])
    check_op("Gemm", inputs, {"transA": trans_a, "transB": trans_b, "alpha": 0.5,
                              "beta": 2.0})


def test_gemm_defaults():
    check_op("Gemm", [rand(3, 4), rand(4, 5), rand(5)])


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("axis", [None, 0, 1, -2, 2])
def test_softmax(op, axis):
    attrs = {} if axis is None else {"axis": axis}
    check_op(op, [rand(2, 3, 5, low=-5, high=5)], attrs)
    check_op(op, [rand(2, 3, 5, low=-5, high=5)], attrs, opset=13)


@pytest.mark.parametrize("axis", [-1, 1, 2])
@pytest.mark.parametrize("bias", [True, False])
def test_layernorm(axis, bias):
    x = rand(2, 3, 8, low=-3, high=3)
    normalized = x.shape[axis:]
    inputs = [x, rand(*normalized, seed=4)] + ([rand(*normalized, seed=5)] if bias else [])
    check_op("LayerNormalization", inputs, {"axis": axis, "epsilon": 1e-3}, opset=17)


def test_layernorm_broadcast_scale():
    check_op("LayerNormalization", [rand(2, 3, 8), rand(8, seed=4), rand(8, seed=5)],
             {"axis": 1})


def test_instance_and_batch_norm():
    x = rand(2, 3, 5, 4)
    check_op("InstanceNormalization", [x, rand(3, seed=1), rand(3, seed=2)], {"epsilon": 1e-4})
    var = rand(3, seed=4, low=0.5, high=2)
    for opset in (13, 15, 21):
        check_op("BatchNormalization", [x, rand(3, seed=1), rand(3, seed=2), rand(3, seed=3),
                                        var], {"epsilon": 1e-3}, opset=opset)
    check_op("BatchNormalization", [rand(4, 3), rand(3, seed=1), rand(3, seed=2),
                                    rand(3, seed=3), var])


def infer(op, shapes, dtype="float32", **attrs):
    node = Node.make(op, [f"i{k}" for k in range(len(shapes))], ["y"], name="n", **attrs)
    return infer_node(node, [TensorType(dtype, s) for s in shapes])


def test_errors():
    with pytest.raises(ShapeError, match=r"node 'n' \(MatMul\): input 1 has shape \[5,6\]: its "
                                         r"dim 0 is 5, expected 4 \(last dim of input 0 \[3,4\]"):
        infer("MatMul", [(3, 4), (5, 6)])
    with pytest.raises(ShapeError, match="batch dims not broadcastable"):
        infer("MatMul", [(2, 3, 4), (3, 4, 5)])
    with pytest.raises(ShapeError, match="is a scalar"):
        infer("MatMul", [(), (3,)])
    with pytest.raises(ShapeError, match="inner dim 5 does not match 4"):
        infer("Gemm", [(3, 4), (5, 6)])
    with pytest.raises(ShapeError, match=r"input 2 has shape \[4\], not broadcastable to "
                                         r"\[3,6\]"):
        infer("Gemm", [(3, 4), (4, 6), (4,)])
    with pytest.raises(ShapeError, match="axis 3 is out of range for rank 3"):
        infer("Softmax", [(2, 3, 4)], axis=3)
    with pytest.raises(ShapeError, match=r"input 1 has shape \[4\], expected \[3\]"):
        infer("BatchNormalization", [(2, 3, 4), (4,), (3,), (3,), (3,)])
    with pytest.raises(ShapeError, match="training_mode=1 is not supported"):
        infer("BatchNormalization", [(2, 3), (3,), (3,), (3,), (3,)], training_mode=1)


def test_layernorm_extra_outputs_are_rejected():
    node = Node.make("LayerNormalization", ["x", "s"], ["y", "mean"], name="ln")
    types = [TensorType("float32", (2, 4)), TensorType("float32", (4,))]
    with pytest.raises(ShapeError, match=r"node 'ln' \(LayerNormalization\): output 1 "
                                         r"\('mean'\) is not supported"):
        infer_node(node, types)
    omitted = Node.make("LayerNormalization", ["x", "s"], ["y", ""], name="ln")
    assert infer_node(omitted, types) == [TensorType("float32", (2, 4)), None]


def test_kinds():
    assert REGISTRY["MatMul"].kind is OpKind.ANCHOR
    assert REGISTRY["Gemm"].kind is OpKind.ANCHOR
    for op in ["Softmax", "LogSoftmax", "LayerNormalization", "InstanceNormalization"]:
        assert REGISTRY[op].kind is OpKind.REDUCE
    assert REGISTRY["BatchNormalization"].kind is OpKind.BIJECTIVE   # per-channel affine map


@pytest.mark.parametrize("op, inputs, attrs", [
    ("MatMul", [(3, 8), (8, 5)], {}),
    ("Softmax", [(2, 7)], {}),
    ("LayerNormalization", [(2, 8), (8,), (8,)], {}),
    ("Gemm", [(3, 8), (5, 8), (5,)], {"transB": 1}),
])
def test_float16(op, inputs, attrs):
    # float16 results are rounded to 11 bits; ORT's kernels round intermediates too.
    arrays = [rand(*s, seed=k).astype(np.float16) for k, s in enumerate(inputs)]
    check_op(op, arrays, attrs, rtol=2e-3, atol=2e-3)
