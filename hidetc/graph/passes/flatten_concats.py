"""Flatten nested Concats: Concat(a, Concat(b, c), d) along one axis, when the inner
Concat's output is read by nothing else (one consumer, not a graph output), is
Concat(a, b, c, d). Inception-V3's last blocks concatenate two inner concats with two
branches; flat, every input is a branch output the planner can write straight into the
block output (`hidetc.fusion.partition`, concat without copies).

Assumes: nodes in topological order; the verifier's invariants hold (axes in range).
Guarantees: the same outputs (concatenation is associative); graph input/output names
kept; the inner Concat nodes dropped. Returns the same graph object when nothing
applies.
"""
from __future__ import annotations

from collections import Counter

from hidetc.graph.ir import Graph, Node


def _axis(graph: Graph, node: Node) -> int:
    return node.attr("axis") % graph.types[node.outputs[0]].rank


def run(graph: Graph) -> Graph:
    uses = Counter(v for node in graph.nodes for v in node.inputs if v)
    uses.update(graph.outputs)
    concats = {n.outputs[0]: n for n in graph.nodes if n.op == "Concat"}
    flat_inputs: dict[str, tuple[str, ...]] = {}   # Concat output -> its flattened inputs
    rewritten: dict[int, Node] = {}                 # node position -> flat Concat
    inlined: set[str] = set()                       # inner Concat outputs spliced away
    for position, node in enumerate(graph.nodes):
        if node.op != "Concat":
            continue
        axis, flat = _axis(graph, node), []
        for value in node.inputs:
            inner = concats.get(value)
            if inner is not None and uses[value] == 1 and _axis(graph, inner) == axis:
                flat.extend(flat_inputs[value])
                inlined.add(value)
            else:
                flat.append(value)
        flat_inputs[node.outputs[0]] = tuple(flat)
        if tuple(flat) != node.inputs:
            rewritten[position] = node.with_(inputs=tuple(flat))
    if not rewritten:
        return graph
    nodes = tuple(rewritten.get(i, n) for i, n in enumerate(graph.nodes)
                  if not (n.op == "Concat" and n.outputs[0] in inlined))
    types = {k: t for k, t in graph.types.items() if k not in inlined}
    return graph.replace(nodes=nodes, types=types)
