"""Shape, Size, ConstantOfShape, Range, Identity, Dropout, OneHot against ONNX Runtime."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from hidetc.errors import ShapeError
from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.ops import REGISTRY, OpKind
from tests.graph.ort_harness import check_op, rand


@pytest.mark.parametrize("attrs", [{}, {"start": 1}, {"end": -1}, {"start": -2, "end": 3},
                                   {"start": 5}, {"start": -10, "end": 10}, {"start": 3,
                                                                              "end": 1}])
def test_shape(attrs):
    check_op("Shape", [rand(2, 3, 4, 5)], attrs)


def test_shape_opset13_and_size():
    check_op("Shape", [rand(2, 3)], opset=13)
    check_op("Size", [rand(2, 3, 4)])
    check_op("Size", [np.array(1.0, np.float32)])


@pytest.mark.parametrize("value", [None, helper.make_tensor("value", TensorProto.FLOAT, [1], [2.5]),
                                   helper.make_tensor("value", TensorProto.INT64, [1], [7]),
                                   helper.make_tensor("value", TensorProto.BOOL, [1], [True])])
def test_constant_of_shape(value):
    attrs = {} if value is None else {"value": value}
    check_op("ConstantOfShape", [np.array([2, 3], np.int64)], attrs)
    check_op("ConstantOfShape", [np.array([], np.int64)], attrs)


@pytest.mark.parametrize("args", [(0, 10, 3), (10, 0, -3), (2, 2, 1), (-5, 5, 2), (5, 0, 1)])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.float32])
def test_range(args, dtype):
    check_op("Range", [np.array(a, dtype) for a in args])


def test_range_float_accumulation():
    check_op("Range", [np.array(a, np.float32) for a in (0.1, 2.0, 0.3)], rtol=0, atol=0)


def test_identity_dropout():
    x = rand(3, 4)
    check_op("Identity", [x])
    check_op("Dropout", [x])
    check_op("Dropout", [x], outputs=2)
    check_op("Dropout", [x, np.array(0.3, np.float32)], outputs=2, consts=(1,))
    check_op("Dropout", [x, np.array(0.3, np.float32), np.array(False)], consts=(1, 2))


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_onehot(axis):
    indices = np.array([[0, 2], [-1, 5]], np.int64)
    values = np.array([0.5, 3.0], np.float32)
    check_op("OneHot", [indices, np.array(4, np.int64), values], {"axis": axis})


def test_errors():
    i64 = TensorType("int64", (2,))
    with pytest.raises(ShapeError, match=r"node 'c' \(ConstantOfShape\): input 0 \(shape\) "
                                         r"must be a constant known at compile time"):
        infer_node(Node.make("ConstantOfShape", ["s"], ["y"], name="c"), [i64], [None])
    scalar = TensorType("int64", ())
    with pytest.raises(ShapeError, match=r"input 2 \(delta\) is zero"):
        infer_node(Node.make("Range", ["a", "b", "c"], ["y"]), [scalar] * 3,
                   [np.array(0), np.array(5), np.array(0)])
    with pytest.raises(ShapeError, match="training_mode=true is not supported"):
        infer_node(Node.make("Dropout", ["x", "", "t"], ["y"]),
                   [TensorType("float32", (3,)), None, TensorType("bool", ())],
                   [None, None, np.array(True)])


def test_kinds():
    for op in ["Shape", "ConstantOfShape", "Range", "Identity", "Dropout", "Size"]:
        assert REGISTRY[op].kind is OpKind.OTHER
