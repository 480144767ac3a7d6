"""Gather, GatherElements, GatherND, ScatterND, ScatterElements, Trilu against ONNX
Runtime: negative indices, batch_dims, reductions; out-of-range indices."""
import numpy as np
import pytest

from hidetc.errors import ShapeError
from hidetc.graph.evaluate import evaluate_node, infer_node
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.ops import REGISTRY, OpKind
from tests.graph.ort_harness import check_op, rand


def idx(values, dtype=np.int64):
    return np.array(values, dtype=dtype)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("indices", [idx(2), idx([0, -1, 1]), idx([[1, -2], [0, 0]]),
                                     idx([-3, 2], np.int32)])
def test_gather(axis, indices):
    check_op("Gather", [rand(3, 4, 5), indices], {"axis": axis}, consts=())


def test_gather_int_data_and_constant_indices():
    check_op("Gather", [rand(5, 3, dtype=np.int64, low=0, high=9), idx([4, -5])], consts=(1,))


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    data = rand(3, 4)
    check_op("GatherElements", [data, idx([[0, -1, 2], [1, 0, -3]])], {"axis": axis})
    check_op("GatherElements", [data, idx([[1], [2], [-1]], np.int32)], {"axis": axis})


@pytest.mark.parametrize("data_shape, indices, batch_dims", [
    ((2, 3, 4), [[0, 1], [1, -1]], 0),
    ((2, 3, 4), [[1], [0]], 0),
    ((2, 3, 4), [[[0, 1, 2]], [[1, 2, -1]]], 0),
    ((2, 3, 4), [[1], [0]], 1),
    ((2, 3, 4), [[[1, 2], [0, 0]], [[2, 3], [-1, -1]]], 1),
    ((2, 3, 4), [[[1], [3], [0]], [[0], [2], [-1]]], 2),
])
def test_gather_nd(data_shape, indices, batch_dims):
    check_op("GatherND", [rand(*data_shape), idx(indices)], {"batch_dims": batch_dims})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd(reduction):
    data = rand(4, 3, 2)
    check_op("ScatterND", [data, idx([[1], [-1]]), rand(2, 3, 2, seed=3)],
             {"reduction": reduction})
    check_op("ScatterND", [data, idx([[0, 1], [2, 2]]), rand(2, 2, seed=4)],
             {"reduction": reduction})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements(reduction, axis):
    check_op("ScatterElements", [rand(3, 4), idx([[0, -1], [2, 1]]), rand(2, 2, seed=5)],
             {"axis": axis, "reduction": reduction})


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 2, -1])
def test_trilu(upper, k):
    inputs = [rand(2, 4, 5)] + ([] if k is None else [np.array(k, np.int64)])
    check_op("Trilu", inputs, {"upper": upper}, consts=(1,))


def test_out_of_range_index_is_an_error():
    node = Node.make("Gather", ["d", "i"], ["y"], name="g")
    with pytest.raises(ShapeError, match=r"node 'g' \(Gather\): index 3 is out of range for "
                                         r"dim size 3"):
        evaluate_node(node, [rand(3, 2), idx([0, 3])])
    with pytest.raises(ShapeError, match="index -4 is out of range"):
        evaluate_node(node, [rand(3, 2), idx([-4])])


def test_errors():
    f = TensorType("float32", (2, 3, 4))
    with pytest.raises(ShapeError, match="input 1 has dtype float32, expected one of int32"):
        infer_node(Node.make("Gather", ["d", "i"], ["y"]), [f, f])
    with pytest.raises(ShapeError, match="expected the same rank"):
        infer_node(Node.make("GatherElements", ["d", "i"], ["y"]),
                   [f, TensorType("int64", (2, 3))])
    with pytest.raises(ShapeError, match="last dim 4 exceeds the rank 3"):
        infer_node(Node.make("GatherND", ["d", "i"], ["y"]), [f, TensorType("int64", (5, 4))])
    with pytest.raises(ShapeError, match="must share their first 1 dims"):
        infer_node(Node.make("GatherND", ["d", "i"], ["y"], batch_dims=1),
                   [f, TensorType("int64", (3, 1))])


def test_kinds():
    for op in ["Gather", "GatherElements", "GatherND", "Trilu"]:
        assert REGISTRY[op].kind is OpKind.INJECTIVE
    assert REGISTRY["ScatterND"].kind is OpKind.OTHER
