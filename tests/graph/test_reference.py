"""run_graph: the numpy oracle over whole graphs; input validation and memory release."""
import tracemalloc

import numpy as np
import pytest

from hidetc.errors import InputError
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.graph.reference import run_graph


def small_graph():
    f = TensorType("float32", (2, 3))
    nodes = (Node.make("MatMul", ["x", "w"], ["h"], name="mm"),
             Node.make("Add", ["h", "b"], ["z"], name="add"),
             Node.make("Relu", ["z"], ["y"], name="relu"))
    types = {"x": f, "w": TensorType("float32", (3, 4)), "b": TensorType("float32", (4,)),
             "h": TensorType("float32", (2, 4)), "z": TensorType("float32", (2, 4)),
             "y": TensorType("float32", (2, 4))}
    consts = {"w": np.arange(12, dtype=np.float32).reshape(3, 4) - 5,
              "b": np.full(4, -1.0, np.float32)}
    return Graph(("x",), ("y", "h"), nodes, types, consts)


def test_runs_nodes_in_order_and_returns_outputs_by_name():
    graph = small_graph()
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    result = run_graph(graph, {"x": x})
    assert list(result) == ["y", "h"]
    h = x @ graph.constants["w"]
    np.testing.assert_array_equal(result["h"], h)
    np.testing.assert_array_equal(result["y"], np.maximum(h - 1, 0))


def test_input_errors():
    graph = small_graph()
    good = np.zeros((2, 3), np.float32)
    with pytest.raises(InputError, match=r"^missing input 'x' \(expected float32\[2,3\]\)$"):
        run_graph(graph, {})
    with pytest.raises(InputError, match=r"^unknown input 'q' \(model inputs: x\)$"):
        run_graph(graph, {"x": good, "q": good})
    with pytest.raises(InputError, match=r"^input 'x' has dtype float64, expected float32$"):
        run_graph(graph, {"x": good.astype(np.float64)})
    with pytest.raises(InputError, match=r"^input 'x' has shape \[3, 2\], expected \[2, 3\]$"):
        run_graph(graph, {"x": good.reshape(3, 2)})


def test_declared_type_mismatch_is_a_bug():
    graph = small_graph()
    types = dict(graph.types)
    types["z"] = TensorType("float32", (4, 2))
    with pytest.raises(RuntimeError, match=r"node 'add' \(Add\): output 'z' is float32\[2,4\], "
                                           r"declared float32\[4,2\]"):
        run_graph(graph.replace(types=types), {"x": np.zeros((2, 3), np.float32)})


def test_intermediate_values_are_released():
    t = TensorType("float32", (1 << 20,))  # 4 MiB per value
    names = ["x"] + [f"v{i}" for i in range(24)]
    nodes = tuple(Node.make("Neg", [a], [b]) for a, b in zip(names, names[1:]))
    graph = Graph(("x",), (names[-1],), nodes, {n: t for n in names})
    x = np.ones(t.shape, np.float32)
    tracemalloc.start()
    try:
        run_graph(graph, {"x": x})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 6 * t.nbytes  # not 24 live values
