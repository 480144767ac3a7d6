"""simplify_pow: Pow with a constant exponent in {1, 2, 3, 4, 0.5, -1} becomes Mul/Sqrt/
Reciprocal/nothing; the graph computes the same (numpy reference, within 2 ulp) and
other Pows are left alone."""
from __future__ import annotations

import numpy as np
import pytest

from hidetc.graph.ir import Node
from hidetc.graph.passes import simplify_pow
from hidetc.graph.pipeline import optimize
from hidetc.graph.reference import run_graph
from hidetc.graph.verify import verify_graph
from tests.graph.test_passes import build

N = Node.make
X = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32) * 3
X[0, :6] = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-20]


def pow_graph(c, *, dtype="float32", x_shape=(4, 33), after=True, const_dtype=np.float32):
    """x -> Pow(x, c) [-> Relu] -> y."""
    nodes = [N("Pow", ["x", "c"], ["p"], name="pow")]
    if after:
        nodes.append(N("Relu", ["p"], ["y"], name="relu"))
    return build({"x": (dtype, x_shape)}, nodes, ["y" if after else "p"],
                 {"c": np.array(c, dtype=const_dtype)})


def max_ulp(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    same = (a == b) | (np.isnan(a) & np.isnan(b))
    ulp = np.spacing(np.abs(b).astype(np.float32)).astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.where(same, 0.0, np.abs(a - b) / ulp)
    return float(np.nan_to_num(err, nan=np.inf).max())


@pytest.mark.parametrize("c,ops,ulps", [
    (2.0, {"Mul": 1}, 0), (3.0, {"Mul": 2}, 2), (4.0, {"Mul": 2}, 2),
    (0.5, {"Sqrt": 1}, 0), (-1.0, {"Reciprocal": 1}, 0), (1.0, {}, 0)])
def test_rewrites_and_matches_pow(c, ops, ulps):
    graph = pow_graph(c)
    out = simplify_pow.run(graph)
    verify_graph(out)
    assert out.op_counts() == {**ops, "Relu": 1}
    assert out.outputs == ("y",) and out.types["y"] == graph.types["y"]
    x = np.abs(X) if c == 0.5 else X      # pow(-0, .5) = +0, Sqrt(-0) = -0 (documented)
    want, got = run_graph(graph, {"x": x})["y"], run_graph(out, {"x": x})["y"]
    assert max_ulp(got, want) <= ulps


def test_names_stay_unique_and_the_output_keeps_its_name():
    graph = pow_graph(4.0, after=False)
    out = simplify_pow.run(graph)
    verify_graph(out)
    assert out.outputs == ("p",) and out.op_counts() == {"Mul": 2}
    names = [n.name for n in out.nodes]
    values = [o for n in out.nodes for o in n.outputs]
    assert len(set(names)) == len(names) and len(set(values)) == len(values)
    assert out.nodes[-1].outputs == ("p",)


def test_exponent_one_on_the_interface_keeps_an_identity():
    out = simplify_pow.run(pow_graph(1.0, after=False))
    assert out.op_counts() == {"Identity": 1} and out.outputs == ("p",)
    np.testing.assert_array_equal(run_graph(out, {"x": X})["p"], X)


def test_integer_exponent_constant_and_float64_base():
    graph = pow_graph(3, dtype="float64", const_dtype=np.int64)
    out = simplify_pow.run(graph)
    assert out.op_counts() == {"Mul": 2, "Relu": 1}
    x = X.astype(np.float64)
    np.testing.assert_allclose(run_graph(out, {"x": x})["y"], run_graph(graph, {"x": x})["y"],
                               rtol=1e-15)


@pytest.mark.parametrize("graph", [
    pow_graph(2.5), pow_graph(0.0), pow_graph(3.0, dtype="int64", const_dtype=np.int64),
    pow_graph(np.full((1, 1, 1), 2.0)),
], ids=["other_exponent", "zero", "int_base", "broadcasting_exponent"])
def test_leaves_other_pows_alone(graph):
    assert simplify_pow.run(graph) is graph


def test_non_constant_exponent_is_left_alone():
    graph = build({"x": ("float32", (3,)), "c": ("float32", ())},
                  [N("Pow", ["x", "c"], ["y"])], ["y"])
    assert simplify_pow.run(graph) is graph


def test_pipeline_rewrites_gpt2_gelu():
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 Pow(x, 3)))): no Pow after optimize."""
    k = {"three": np.array(3.0, np.float32), "a": np.array(0.044715, np.float32),
         "s": np.array(np.sqrt(2 / np.pi), np.float32), "one": np.array(1.0, np.float32),
         "half": np.array(0.5, np.float32)}
    nodes = [N("Pow", ["x", "three"], ["x3"]), N("Mul", ["x3", "a"], ["t0"]),
             N("Add", ["x", "t0"], ["t1"]), N("Mul", ["t1", "s"], ["t2"]),
             N("Tanh", ["t2"], ["t3"]), N("Add", ["t3", "one"], ["t4"]),
             N("Mul", ["x", "t4"], ["t5"]), N("Mul", ["t5", "half"], ["y"])]
    graph = build({"x": ("float32", (8, 31))}, nodes, ["y"], k)
    out = optimize(graph, verify=True)
    assert "Pow" not in out.op_counts()
    x = np.random.default_rng(1).standard_normal((8, 31)).astype(np.float32) * 4
    np.testing.assert_allclose(run_graph(out, {"x": x})["y"], run_graph(graph, {"x": x})["y"],
                               rtol=1e-6, atol=1e-7)
