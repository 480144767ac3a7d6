"""Hoist the layout pass's NCHW -> NHWC transposes above channel Concats and Resizes.

`choose_layout` sinks transposes downwards, from a convolution's output into what
reads it; a value that reaches a channels-last convolution from NCHW producers keeps
its `Transpose(perm 0,2,3,1)` right before the convolution. When that value is a
channel Concat or a spatial Resize of NCHW values (SegFormer's decode head: four
token maps reshaped to NCHW, each upsampled bilinearly, concatenated, then a 1x1
convolution), the transpose gathers every output element across channel planes, with
the Resize's coordinate arithmetic per element in that scattered order (what that
cost: bench/results/2026-12-06-exported-models.md). Applied to the Concat's or Resize's
inputs instead:

    Transpose(Concat(a, b, axis=1))   -> Concat(Transpose(a), Transpose(b), axis=3)
    Transpose(Resize(x, roi, scales)) -> Resize(Transpose(x), roi', scales')

(scales / sizes / roi permuted the same way), repeated until nothing moves; the
transposes then meet the producers' own reshuffles (`Transpose -> Reshape` of a token
map), where `fold_movement_chains` (run next) turns the chain into a free Reshape,
and the Resize interpolates along contiguous channel vectors.

Only a Concat or Resize whose output has no other reader moves (nothing computes
twice), 4-D, Concat on axis 1, Resize without `axes` and with the `stretch` policy and
N and C unscaled. Guarantees: the same outputs (Resize interpolates the axes in
another order, in float64); names and types of graph outputs kept. Returns the same
graph when nothing moves.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from hidetc.graph.ir import Graph, Node
from hidetc.graph.ops.layout import TO_NHWC
from hidetc.graph.passes import eliminate_dead_code
from hidetc.graph.passes.common import Rewriter, node_base


def _is_to_nhwc(node: Node) -> bool:
    return node.op == "Transpose" and tuple(node.attr("perm") or ()) == TO_NHWC


def _movable(graph: Graph, node: Node) -> bool:
    if len(graph.types[node.outputs[0]].shape) != 4:
        return False
    if node.op == "Concat":
        return node.attr("axis") in (1, -3)
    if node.op != "Resize" or node.attr("axes") is not None:
        return False
    if (node.attr("keep_aspect_ratio_policy") or "stretch") != "stretch":
        return False
    if any(v and v not in graph.constants for v in node.inputs[1:4]):
        return False
    _, scales, sizes = ([graph.constants.get(v) if v else None for v in node.inputs[1:4]]
                        + [None, None, None])[:3]
    x = graph.types[node.inputs[0]].shape
    if scales is not None and scales.size:
        return bool(np.all(np.asarray(scales)[:2] == 1))
    if sizes is not None and sizes.size:
        return tuple(int(s) for s in np.asarray(sizes)[:2]) == tuple(x[:2])
    return False


def _permuted(array: np.ndarray, roi: bool = False) -> np.ndarray:
    """A per-axis NCHW constant (or a roi: starts then ends) in NHWC order."""
    a = np.asarray(array)
    if roi:
        return np.concatenate([a[:4][list(TO_NHWC)], a[4:][list(TO_NHWC)]])
    return a[list(TO_NHWC)]


def run(graph: Graph) -> Graph:
    moved = False
    while True:
        out = _once(graph)
        if out is graph:
            break
        graph, moved = out, True
    return eliminate_dead_code.run(graph) if moved else graph


def _once(graph: Graph) -> Graph:
    uses = Counter(v for n in graph.nodes for v in n.inputs if v)
    producer = {o: n for n in graph.nodes for o in n.outputs if o}
    moves: dict[int, Node] = {}          # id(transpose) -> the producer it moves above
    taken: set[int] = set()
    for node in graph.nodes:
        if not _is_to_nhwc(node):
            continue
        value = node.inputs[0]
        p = producer.get(value)
        if (p is None or id(p) in taken or uses[value] != 1 or value in graph.outputs
                or not _movable(graph, p)):
            continue
        moves[id(node)] = p
        taken.add(id(p))
    if not moves:
        return graph
    rw = Rewriter(graph)
    for node in graph.nodes:
        if id(node) in taken:
            rw.changed = True                  # re-emitted in place of its transpose
            continue
        p = moves.get(id(node))
        if p is None:
            rw.emit(node)
            continue
        base = node_base(p)
        if p.op == "Concat":
            inputs = [rw.add("Transpose", (v,), f"{base}_nhwc", perm=TO_NHWC)
                      for v in p.inputs]
            rw.emit_typed(p.with_(inputs=tuple(inputs), outputs=node.outputs,
                                  attrs={**p.attr_dict, "axis": 3}))
            continue
        x = rw.add("Transpose", (p.inputs[0],), f"{base}_nhwc", perm=TO_NHWC)
        extra = []
        for k, v in enumerate(p.inputs[1:4], start=1):
            array = graph.constants.get(v) if v else None
            if array is None or np.asarray(array).size == 0:
                extra.append(v)
            else:
                extra.append(rw.const(f"{base}_nhwc_in{k}", _permuted(array, roi=k == 1)))
        rw.emit_typed(p.with_(inputs=(x, *extra), outputs=node.outputs))
    return rw.finish()
