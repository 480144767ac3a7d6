"""infer_node / evaluate_node: lookup, error wrapping, output fitting; registry sanity."""
import warnings

import numpy as np
import pytest

from hidetc.errors import ShapeError
from hidetc.graph.evaluate import evaluate_node, infer_node, type_values
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.ops import REGISTRY, OpKind, get_op

F3 = TensorType("float32", (3,))


def test_errors_name_the_node_once():
    node = Node.make("Add", ["a", "b"], ["c"], name="/layer1/Add")
    with pytest.raises(ShapeError) as info:
        infer_node(node, [TensorType("float32", (3, 4)), TensorType("float32", (5,))])
    assert str(info.value).startswith("node '/layer1/Add' (Add): input 1 has shape [5]")
    assert "(Add): Add:" not in str(info.value)


def test_unknown_op():
    with pytest.raises(ShapeError, match=r"node 'n' \(Foo\): unknown op type 'Foo'"):
        infer_node(Node.make("Foo", ["a"], ["b"], name="n"), [F3])
    with pytest.raises(ShapeError, match=r"node 'n' \(Foo\)"):
        evaluate_node(Node.make("Foo", ["a"], ["b"], name="n"), [np.zeros(3)])


def test_evaluate_returns_arrays_with_promised_dtypes():
    node = Node.make("Add", ["a", "b"], ["c"])
    (c,) = evaluate_node(node, [np.array(1.0, np.float32), np.array(2.0, np.float32)])
    assert isinstance(c, np.ndarray) and c.shape == () and c.dtype == np.float32
    (m,) = evaluate_node(Node.make("ReduceSum", ["x"], ["y"], keepdims=0),
                         [np.ones((2, 3), np.float32)])
    assert isinstance(m, np.ndarray) and m.dtype == np.float32 and m.shape == ()


def test_no_floating_point_warnings():
    node = Node.make("Log", ["x"], ["y"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (y,) = evaluate_node(node, [np.array([0.0, -1.0, 1.0], np.float32)])
    assert y[0] == -np.inf and np.isnan(y[1]) and y[2] == 0


def test_outputs_are_fitted_to_the_node():
    x = np.ones((2, 2), np.float32)
    one = Node.make("Dropout", ["x"], ["y"])
    assert len(evaluate_node(one, [x])) == 1
    assert len(infer_node(one, [TensorType.of(x)])) == 1
    two = Node.make("Dropout", ["x"], ["y", "mask"])
    assert infer_node(two, [TensorType.of(x)])[1] == TensorType("bool", (2, 2))
    with pytest.raises(ShapeError, match=r"output 1 \('extra'\) is not supported; the op "
                                         r"produces 1 output"):
        infer_node(Node.make("Relu", ["x"], ["y", "extra"], name="r"), [TensorType.of(x)])


def test_type_values():
    t = TensorType("float32", (2, 3, 4))
    assert type_values(Node.make("Shape", ["x"], ["s"], start=1), [t])[0].tolist() == [3, 4]
    assert type_values(Node.make("Size", ["x"], ["s"]), [t])[0].tolist() == 24
    assert type_values(Node.make("Relu", ["x"], ["s"]), [t]) is None


def test_registry_is_consistent():
    assert get_op("Conv").kind is OpKind.ANCHOR
    for name, opdef in REGISTRY.items():
        assert opdef.name == name
        assert isinstance(opdef.kind, OpKind)
        assert callable(opdef.infer) and callable(opdef.reference)
        assert all(isinstance(i, int) and i >= 0 for i in opdef.value_inputs)
    assert len(REGISTRY) >= 100
