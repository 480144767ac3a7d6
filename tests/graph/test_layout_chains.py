"""The passes after the layout pass: `hoist_transposes` (the NHWC transpose before a
convolution moved above channel Concats and spatial Resizes) and `fold_movement_chains`
(Transpose/Reshape chains that move no element become one Reshape). Each rewrite must
compute what the graph computed (reference interpreter) and keep its interface; the
SegFormer-style head and Mix-FFN patterns must end with no transpose left."""
from __future__ import annotations

import numpy as np
import pytest
from graph.test_choose_layout import assert_same, build, count

from hidetc.graph.ir import Node
from hidetc.graph.passes import choose_layout, fold_movement_chains, hoist_transposes
from hidetc.graph.passes.fold_movement_chains import keeps_order

N = Node.make
RNG = np.random.default_rng(0)


def segformer_head():
    """Two token maps [1, h*w, 8] -> NCHW (Transpose, Reshape) -> bilinear Resize to
    8x8 -> channel Concat -> 1x1 Conv; plus a Mix-FFN depthwise conv on a third token
    map whose output is read back as tokens (flatten(2).transpose(1, 2))."""
    consts = {"w": RNG.standard_normal((4, 16, 1, 1)).astype(np.float32),
              "dw": RNG.standard_normal((8, 1, 3, 3)).astype(np.float32),
              "s1": np.array([1, 8, 4, 4], np.int64), "s2": np.array([1, 8, 8, 8], np.int64),
              "up": np.array([1, 1, 2, 2], np.float32), "roi": np.zeros(0, np.float32),
              "tok": np.array([1, 8, 64], np.int64)}
    nodes = [N("Transpose", ["a"], ["at"], perm=[0, 2, 1]), N("Reshape", ["at", "s1"], ["an"]),
             N("Resize", ["an", "roi", "up"], ["ar"], mode="linear"),
             N("Transpose", ["b"], ["bt"], perm=[0, 2, 1]), N("Reshape", ["bt", "s2"], ["bn"]),
             N("Concat", ["ar", "bn"], ["c"], axis=1),
             N("Conv", ["c", "w"], ["y"]),
             N("Transpose", ["e"], ["et"], perm=[0, 2, 1]), N("Reshape", ["et", "s2"], ["en"]),
             N("Conv", ["en", "dw"], ["d"], group=8, pads=[1, 1, 1, 1]),
             N("Reshape", ["d", "tok"], ["df"]), N("Transpose", ["df"], ["z"], perm=[0, 2, 1])]
    return build({"a": ("float32", (1, 16, 8)), "b": ("float32", (1, 64, 8)),
                  "e": ("float32", (1, 64, 8))}, nodes,
                 ["y", "z"], consts)


def test_the_segformer_head_keeps_no_transpose():
    graph = segformer_head()
    nhwc = choose_layout.run(graph, choose_layout.wants_nhwc_cpu)
    assert count(nhwc, "Transpose") >= 4
    hoisted = hoist_transposes.run(nhwc)
    assert_same(graph, hoisted)
    resize = next(n for n in hoisted.nodes if n.op == "Resize")
    assert hoisted.constants[resize.inputs[2]].tolist() == [1, 2, 2, 1]   # NHWC scales now
    folded = fold_movement_chains.run(hoisted)
    assert_same(graph, folded)
    # what is left moves no element: only the graph output "y" is transposed back
    moving = [n for n in folded.nodes if n.op == "Transpose"]
    assert [n.outputs for n in moving] == [("y",)], [(n.inputs, n.outputs) for n in moving]


def test_chains_that_move_elements_stay():
    consts = {"s": np.array([1, 4, 6], np.int64)}
    nodes = [N("Transpose", ["x"], ["t"], perm=[0, 2, 1]), N("Reshape", ["t", "s"], ["r"]),
             N("Relu", ["r"], ["y"])]
    graph = build({"x": ("float32", (1, 6, 4))}, nodes, ["y"], consts)
    assert not keeps_order(graph, list(graph.nodes[:2]))
    assert fold_movement_chains.run(graph) is graph


@pytest.mark.parametrize("perm", [(0, 2, 3, 1), (0, 1, 2, 3)])
def test_order_preserving_chains_become_one_reshape(perm):
    """NHWC -> NCHW -> flatten -> tokens: no element moves; a chain whose values
    have other readers (or are graph outputs) stays."""
    consts = {"s": np.array([1, 3, 20], np.int64)}
    nodes = [N("Transpose", ["x"], ["t"], perm=[0, 3, 1, 2]), N("Reshape", ["t", "s"], ["r"]),
             N("Transpose", ["r"], ["y"], perm=[0, 2, 1])]
    graph = build({"x": ("float32", (1, 4, 5, 3))}, nodes, ["y"], consts)
    folded = fold_movement_chains.run(graph)
    assert [n.op for n in folded.nodes] == ["Reshape"] and folded.outputs == ("y",)
    assert_same(graph, folded)
    shared = build({"x": ("float32", (1, 4, 5, 3))}, nodes, ["y", "t"], consts)
    assert fold_movement_chains.run(shared) is shared
