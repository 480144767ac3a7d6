"""The flatten_concats pass: nested Concats on one axis become one when the inner one
has no other reader (Inception-V3's Mixed_7b/7c shape); an inner Concat on another
axis, read twice, or a graph output stays. The rewritten graph verifies and computes
the same outputs (numpy reference)."""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import Node
from hidetc.graph.passes import flatten_concats
from hidetc.graph.reference import run_graph
from hidetc.graph.verify import verify_graph
from tests.graph.test_choose_layout import build

N = Node.make


def _graph(extra_output=False, second_reader=False):
    nodes = [N("Relu", ["x"], ["a"]), N("Neg", ["x"], ["b"]), N("Abs", ["x"], ["c"]),
             N("Concat", ["a", "b"], ["ab"], axis=1),
             N("Concat", ["c", "ab", "x"], ["y"], axis=-3)]
    outputs = ["y"] + (["ab"] if extra_output else [])
    if second_reader:
        nodes.append(N("Sigmoid", ["ab"], ["s"]))
        outputs.append("s")
    return build({"x": ("float32", (1, 2, 3, 3))}, nodes, outputs, {})


def _same(before, after):
    verify_graph(after)
    x = np.random.default_rng(0).standard_normal((1, 2, 3, 3)).astype(np.float32)
    want, got = run_graph(before, {"x": x}), run_graph(after, {"x": x})
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_nested_concat_is_flattened():
    before = _graph()
    after = flatten_concats.run(before)
    _same(before, after)
    (cat,) = [n for n in after.nodes if n.op == "Concat"]
    assert cat.inputs == ("c", "a", "b", "x") and "ab" not in after.types


def test_two_levels_flatten_at_once():
    nodes = [N("Relu", ["x"], ["a"]), N("Concat", ["a", "x"], ["i1"], axis=1),
             N("Concat", ["x", "i1"], ["i2"], axis=1), N("Concat", ["i2", "a"], ["y"], axis=1)]
    before = build({"x": ("float32", (1, 2, 3, 3))}, nodes, ["y"], {})
    after = flatten_concats.run(before)
    _same(before, after)
    assert [n.inputs for n in after.nodes if n.op == "Concat"] == [("x", "a", "x", "a")]


def test_other_axis_shared_or_output_inner_concats_stay():
    for kwargs in ({"extra_output": True}, {"second_reader": True}):
        graph = _graph(**kwargs)
        assert flatten_concats.run(graph) is graph, kwargs
    nodes = [N("Concat", ["x", "x"], ["h"], axis=2), N("Concat", ["x", "x"], ["h2"], axis=-2),
             N("Concat", ["h", "h2"], ["y"], axis=1)]
    graph = build({"x": ("float32", (1, 2, 3, 3))}, nodes, ["y"], {})
    assert flatten_concats.run(graph) is graph
