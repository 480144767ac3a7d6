"""Common subexpression elimination, for constants and for nodes.

Constants: two constants with the same dtype, shape and bytes (at most
`CONSTANT_DEDUPE_LIMIT` elements each) become one; the first in `graph.constants`
order is kept. Nodes: a node with the same op, inputs (after renaming), attributes and
pattern of present outputs as an earlier node is dropped and its outputs renamed to
the earlier node's. Inputs of commutative ops are compared as a multiset, so
`Add(a, b)` and `Add(b, a)` merge.

Assumes: nodes are in topological order; ops other than `NONDETERMINISTIC_OPS` are
pure functions of their inputs and attributes.
Guarantees: graph input and output names are unchanged: a value that is a graph output
is never renamed away (a duplicate constant or node defining one is kept), though it
may serve as the surviving copy. Dropped duplicates leave no trace in `types`. Returns
the same graph object when nothing was merged.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hidetc.graph.ir import Graph, Node
from hidetc.graph.passes.common import NONDETERMINISTIC_OPS, live_types, rename_node

CONSTANT_DEDUPE_LIMIT = 1 << 16
COMMUTATIVE_OPS = frozenset({"Add", "Mul", "Max", "Min", "Sum", "Mean", "And", "Or", "Xor",
                             "Equal", "BitwiseAnd", "BitwiseOr", "BitwiseXor"})


def run(graph: Graph) -> Graph:
    protected = set(graph.outputs)
    subst = dedupe_constants(graph, protected)
    seen: dict[tuple, Node] = {}
    nodes: list[Node] = []
    for node in graph.nodes:
        node = rename_node(node, subst)
        key = node_key(node)
        earlier = seen.get(key)
        if earlier is not None and not protected.intersection(node.outputs):
            subst.update((o, e) for o, e in zip(node.outputs, earlier.outputs) if o)
            continue
        if node.op not in NONDETERMINISTIC_OPS:
            seen.setdefault(key, node)
        nodes.append(node)
    if not subst:
        return graph
    constants = {k: v for k, v in graph.constants.items() if k not in subst}
    types = live_types(graph.types, graph.inputs, constants, nodes)
    return graph.replace(nodes=tuple(nodes), constants=constants, types=types)


def node_key(node: Node) -> tuple[Any, ...]:
    inputs = node.inputs
    if node.op in COMMUTATIVE_OPS:
        inputs = tuple(sorted(inputs))
    present = tuple(bool(out) for out in node.outputs)
    return node.op, inputs, node.attrs, present


def dedupe_constants(graph: Graph, protected: set[str]) -> dict[str, str]:
    """Renaming of duplicate small constants to their first copy."""
    first: dict[tuple, str] = {}
    subst: dict[str, str] = {}
    for name, array in graph.constants.items():
        if array.size > CONSTANT_DEDUPE_LIMIT:
            continue
        key = (str(array.dtype), array.shape, np.ascontiguousarray(array).tobytes())
        if key in first and name not in protected:
            subst[name] = first[key]
        else:
            first.setdefault(key, name)
    return subst
