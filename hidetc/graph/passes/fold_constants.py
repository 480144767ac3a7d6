"""Constant folding: nodes computable at compile time become constants.

Folded: every `Shape` and `Size` node (its value follows from the static type of its
input, whatever that input is: `evaluate.type_values`), and every deterministic node
whose inputs are all constants (`graph.constants`; omitted optional inputs are fine).
Folding runs in graph order, so whole chains collapse: the Shape -> Gather ->
Unsqueeze -> Concat -> Reshape chains exporters emit leave the Reshape with a constant
shape input (the Reshape stays when its data input is not constant).

Size limit: a node is folded only when its outputs hold at most
`max(elements of its constant inputs, FOLD_ELEMENT_LIMIT)` elements, so that Expand,
ConstantOfShape, Tile, Range, Pad, ... never blow a small constant up into a large one
stored in the artifact. Shape/Size are always folded (their results are tiny).

Assumes: `evaluate_node` computes an op's outputs with its numpy reference.
Guarantees: output names and types are unchanged; a folded value (even a graph output)
becomes an entry of `graph.constants` with its declared dtype; nodes are only removed.
Constants left unused are not removed here (eliminate_dead_code does that). Returns the
same graph object when nothing was folded.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from hidetc.errors import ShapeError
from hidetc.graph.evaluate import TYPE_VALUED_OPS, evaluate_node, type_values
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.graph.passes.common import NONDETERMINISTIC_OPS, contiguous

FOLD_ELEMENT_LIMIT = 1 << 16
SHAPE_OPS = frozenset(TYPE_VALUED_OPS)


def run(graph: Graph) -> Graph:
    constants = dict(graph.constants)
    kept: list[Node] = []
    for node in graph.nodes:
        values = fold_node(node, graph.types, constants)
        if values is None:
            kept.append(node)
            continue
        for out, value in zip(node.outputs, values):
            if out:
                constants[out] = as_declared(value, graph.types[out])
    if len(kept) == len(graph.nodes):
        return graph
    return graph.replace(nodes=tuple(kept), constants=constants)


def fold_node(node: Node, types: Mapping[str, TensorType],
              constants: Mapping[str, np.ndarray]) -> list[np.ndarray] | None:
    """The node's output values when it can be folded, else None."""
    if node.op in SHAPE_OPS:
        return type_values(node, [types[node.inputs[0]]])
    if node.op in NONDETERMINISTIC_OPS:
        return None
    if not all(value in constants for value in node.inputs if value):
        return None
    if not small_enough(node, types, constants):
        return None
    inputs = [constants[v] if v else None for v in node.inputs]
    try:
        return evaluate_node(node, inputs)
    except ShapeError:
        if any(x is not None and x.dtype == object for x in inputs):
            return None    # a computation on symbolic sizes: left to run time
        raise


def small_enough(node: Node, types: Mapping[str, TensorType],
                 constants: Mapping[str, np.ndarray]) -> bool:
    if any(types[out].symbolic for out in node.outputs if out):
        return False       # a tensor of symbolic size has no value to fold to
    out_elements = sum(types[out].size for out in node.outputs if out)
    in_elements = sum(int(constants[v].size) for v in node.inputs if v)
    return out_elements <= max(in_elements, FOLD_ELEMENT_LIMIT)


def as_declared(value: np.ndarray, ttype: TensorType) -> np.ndarray:
    """The folded value as a contiguous array with the dtype the graph declares."""
    array = np.asarray(value)
    if array.dtype == object:     # a shape value holding symbolic sizes (int64 declared)
        return array
    if str(array.dtype) != ttype.dtype:
        array = array.astype(ttype.dtype)
    return contiguous(array)
