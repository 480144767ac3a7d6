"""Reductions against ONNX Runtime: axes as input (opset 18+), keepdims,
noop_with_empty_axes, negative axes; ArgMax/ArgMin; CumSum; shape errors."""
import numpy as np
import pytest

from hidetc.errors import ShapeError
from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.ops import REGISTRY, OpKind
from tests.graph.ort_harness import check_op, rand

REDUCES = ["ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp"]
AXES = [[1], [-1], [0, 2], [2, 0, 1]]


@pytest.mark.parametrize("op", REDUCES)
@pytest.mark.parametrize("axes", AXES)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes(op, axes, keepdims):
    low = 0.5 if op == "ReduceLogSum" else -1.5
    x = rand(3, 4, 5, low=low, high=1.5)
    check_op(op, [x, np.array(axes, np.int64)], {"keepdims": keepdims})


@pytest.mark.parametrize("op", REDUCES)
def test_reduce_all_and_noop(op):
    x = rand(2, 3, 4, low=0.5 if op == "ReduceLogSum" else -1.2, high=1.2)
    check_op(op, [x], {"keepdims": 0})
    check_op(op, [x])
    check_op(op, [x, np.array([], np.int64)], {"noop_with_empty_axes": 1})
    check_op(op, [x, np.array([], np.int64)], {"keepdims": 0})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd"])
def test_reduce_int(op):
    x = rand(3, 4, dtype=np.int64, low=-5, high=5)
    check_op(op, [x, np.array([1], np.int64)], {"keepdims": 0})


def test_reduce_large_sum_is_accurate():
    x = rand(64, 4096, low=0, high=1)
    check_op("ReduceMean", [x, np.array([1], np.int64)], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("attrs", [{}, {"axis": 1}, {"axis": -1, "keepdims": 0},
                                   {"axis": 0, "select_last_index": 1}])
def test_arg(op, attrs):
    x = rand(4, 6, dtype=np.int32, low=-3, high=3)  # many ties
    check_op(op, [x], attrs)
    check_op(op, [rand(3, 5, 2)], attrs)


@pytest.mark.parametrize("attrs", [{}, {"exclusive": 1}, {"reverse": 1},
                                   {"exclusive": 1, "reverse": 1}])
def test_cumsum(attrs):
    check_op("CumSum", [rand(3, 5), np.array(1, np.int64)], attrs, consts=(1,))
    check_op("CumSum", [rand(4, 3, dtype=np.int32, low=-5, high=5), np.array(-2, np.int32)],
             attrs, consts=(1,))


def test_reduce_errors():
    node = Node.make("ReduceMean", ["x", "axes"], ["y"], name="r")
    types = [TensorType("float32", (2, 3)), TensorType("int64", (1,))]
    with pytest.raises(ShapeError, match=r"node 'r' \(ReduceMean\): input 1 \(axes\) must be "
                                         r"a constant known at compile time"):
        infer_node(node, types, [None, None])
    with pytest.raises(ShapeError, match="axes 2 is out of range for rank 2"):
        infer_node(node, types, [None, np.array([2], np.int64)])
    with pytest.raises(ShapeError, match="contain duplicates"):
        infer_node(node, [types[0], TensorType("int64", (2,))],
                   [None, np.array([1, -1], np.int64)])
    out = infer_node(node, types, [None, np.array([-1], np.int64)])
    assert out == [TensorType("float32", (2, 1))]


def test_kinds():
    for op in REDUCES + ["ArgMax", "ArgMin", "CumSum"]:
        assert REGISTRY[op].kind is OpKind.REDUCE
    assert REGISTRY["ReduceSum"].value_inputs == (1,)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ReduceSum", "ReduceProd"])
def test_reduce_empty_axis_gives_identity(op):
    check_op(op, [np.zeros((2, 0, 4), np.float32), np.array([1], np.int64)])
