"""Dead code elimination: drop nodes and constants the graph outputs do not need.

Assumes: nodes are in topological order and have no side effects (inference graphs).
Guarantees: a node is kept when any of its outputs is (transitively) needed by a graph
output; a multi-output node is kept whole. Constants no kept node or graph output uses
are dropped. Graph inputs are never removed (they are the interface), even unused ones.
`types` is pruned to the remaining values. Returns the same graph object when nothing
was removed.
"""
from __future__ import annotations

from hidetc.graph.ir import Graph, Node
from hidetc.graph.passes.common import live_types


def run(graph: Graph) -> Graph:
    needed = set(graph.outputs)
    kept: list[Node] = []
    for node in reversed(graph.nodes):
        if any(out in needed for out in node.outputs if out):
            kept.append(node)
            needed.update(value for value in node.inputs if value)
    constants = {name: array for name, array in graph.constants.items() if name in needed}
    if len(kept) == len(graph.nodes) and len(constants) == len(graph.constants):
        return graph
    nodes = tuple(reversed(kept))
    types = live_types(graph.types, graph.inputs, constants, nodes)
    return graph.replace(nodes=nodes, constants=constants, types=types)
