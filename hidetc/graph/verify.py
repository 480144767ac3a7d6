"""Graph verifier: the structural and type invariants every pass must keep.

`verify_graph(graph)` raises `GraphVerifyError` (an AssertionError: a failure is a
compiler bug, not a user error) naming the first broken rule:
  - a value is defined twice (graph input, constant, node output);
  - a node uses a value not defined before it (inputs, constants, earlier outputs);
  - a defined value has no type, or a constant's type disagrees with its array;
  - a graph output is not defined;
  - a node's output types disagree with its op's inference rule (`infer_node`).

To check ops whose shape rule needs input values (Reshape's shape, Slice's starts...)
before constant folding has run, the verifier propagates values the way
fold_constants would: Shape/Size from static types, and small all-known nodes by
evaluating them (outputs of at most FOLD_ELEMENT_LIMIT elements).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from hidetc.errors import HidetcError
from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.graph.passes.fold_constants import FOLD_ELEMENT_LIMIT, SHAPE_OPS, fold_node
from hidetc.graph.symbolic import SymDim


class GraphVerifyError(AssertionError):
    """A graph breaks an IR invariant (a bug in the importer or a pass)."""


def verify_graph(graph: Graph) -> None:
    check_definitions(graph)
    check_types(graph)
    check_inference(graph)


def fail(graph: Graph, message: str) -> None:
    raise GraphVerifyError(f"graph {graph.name}: {message}")


def check_definitions(graph: Graph) -> None:
    defined: set[str] = set()

    def define(value: str, what: str) -> None:
        if value in defined:
            fail(graph, f"value {value!r} defined twice ({what})")
        defined.add(value)

    for value in graph.inputs:
        define(value, "graph input")
    for value in graph.constants:
        define(value, "constant")
    for index, node in enumerate(graph.nodes):
        for value in node.inputs:
            if value and value not in defined:
                fail(graph, f"node #{index} {node.op} {node.name!r} uses {value!r} "
                            "before it is defined")
        for value in node.outputs:
            if value:
                define(value, f"output of node #{index} {node.op} {node.name!r}")
    for value in graph.outputs:
        if value not in defined:
            fail(graph, f"graph output {value!r} is not defined")


def check_types(graph: Graph) -> None:
    values = list(graph.inputs) + list(graph.constants)
    values += [out for node in graph.nodes for out in node.outputs if out]
    for value in values:
        if value not in graph.types:
            fail(graph, f"value {value!r} has no type")
    for name, array in graph.constants.items():
        if not isinstance(array, np.ndarray):
            fail(graph, f"constant {name!r} is a {type(array).__name__}, not a numpy array")
        if array.dtype == object and not all(isinstance(v, (int, SymDim))
                                             for v in array.ravel()):
            fail(graph, f"constant {name!r} is an object array that is not a shape value")
        actual = TensorType.of(array)
        if actual != graph.types[name]:
            fail(graph, f"constant {name!r} is {actual} but typed {graph.types[name]}")


def check_inference(graph: Graph) -> None:
    values: dict[str, np.ndarray] = dict(graph.constants)
    for index, node in enumerate(graph.nodes):
        types = [graph.types[v] if v else None for v in node.inputs]
        try:
            inferred = infer_node(node, types, [values.get(v) if v else None
                                                for v in node.inputs])
        except HidetcError as error:
            fail(graph, f"node #{index} {node.op} {node.name!r}: inference failed: {error}")
        last_present = max((i for i, out in enumerate(node.outputs) if out), default=-1)
        present = [(out, t) for out, t in zip(node.outputs, inferred) if out]
        if len(inferred) <= last_present or any(graph.types[o] != t for o, t in present):
            declared = [str(graph.types[o]) for o in node.outputs if o]
            fail(graph, f"node #{index} {node.op} {node.name!r}: outputs typed {declared}, "
                        f"inference gives {[str(t) for t in inferred]}")
        propagate_values(node, graph.types, values)


def propagate_values(node: Node, types: Mapping[str, TensorType],
                     values: dict[str, np.ndarray]) -> None:
    """Record the node's output values when they are cheap to know (see module doc)."""
    outs = [types[out] for out in node.outputs if out]
    small = not any(t.symbolic for t in outs) and \
        sum(t.size for t in outs) <= FOLD_ELEMENT_LIMIT    # (symbolic: not a guard)
    if node.op not in SHAPE_OPS and not small:
        return
    outputs = fold_node(node, types, values)
    if outputs is not None:
        values.update((out, v) for out, v in zip(node.outputs, outputs) if out)
