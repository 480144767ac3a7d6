"""The numpy interpreter of a whole graph: the oracle every later stage is tested against.

Assumes: `graph.nodes` are in topological order and `graph.types` covers every value.
Guarantees: user inputs are validated (names, dtypes, shapes) with one-line
`InputError`s; nodes run in order through `evaluate_node`; a value is dropped right after
its last use; every computed value is checked against its declared type (a mismatch is
a bug in an op definition or a pass, reported as RuntimeError). Returns the graph
outputs by name, in `graph.outputs` order.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from hidetc.errors import InputError
from hidetc.graph.evaluate import evaluate_node
from hidetc.graph.ir import Graph, TensorType


def check_inputs(graph: Graph, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Validate run inputs against the graph's inputs; return them as ndarrays."""
    unknown = [name for name in inputs if name not in graph.inputs]
    if unknown:
        raise InputError(f"unknown input '{unknown[0]}' (model inputs: "
                         f"{', '.join(graph.inputs) or 'none'})")
    result = {}
    for name in graph.inputs:
        want = graph.types[name]
        if name not in inputs:
            raise InputError(f"missing input '{name}' (expected {want})")
        value = inputs[name]
        if not isinstance(value, np.ndarray):
            value = np.asarray(value)
        if str(value.dtype) != want.dtype:
            raise InputError(f"input '{name}' has dtype {value.dtype}, expected {want.dtype}")
        if tuple(value.shape) != want.shape:
            raise InputError(f"input '{name}' has shape {list(value.shape)}, expected "
                             f"{list(want.shape)}")
        result[name] = value
    return result


def _last_uses(graph: Graph) -> dict[str, int]:
    last: dict[str, int] = {}
    for index, node in enumerate(graph.nodes):
        for value in node.inputs:
            if value:
                last[value] = index
    return last


def run_graph(graph: Graph, inputs: Mapping[str, np.ndarray],
              check_types: bool = True, keep_all: bool = False) -> dict[str, np.ndarray]:
    """Run `graph` on `inputs` with the numpy references; return its outputs by name
    (`keep_all`: every value it computed, the inputs and constants too)."""
    env: dict[str, np.ndarray] = dict(graph.constants)
    env.update(check_inputs(graph, inputs))
    keep = set(graph.outputs)
    if keep_all:
        keep.update(o for node in graph.nodes for o in node.outputs if o)
    last = _last_uses(graph)
    for index, node in enumerate(graph.nodes):
        args = [env[name] if name else None for name in node.inputs]
        results = evaluate_node(node, args)
        for name, value in zip(node.outputs, results):
            if not name:
                continue
            if check_types and TensorType.of(value) != graph.types[name]:
                raise RuntimeError(f"node '{node.name}' ({node.op}): output '{name}' is "
                                   f"{TensorType.of(value)}, declared {graph.types[name]}")
            env[name] = value
        for name in set(node.inputs):
            if name and last.get(name) == index and name not in keep:
                env.pop(name, None)
    missing = [name for name in graph.outputs if name not in env]
    if missing:
        raise RuntimeError(f"graph output '{missing[0]}' was never computed")
    return dict(env) if keep_all else {name: env[name] for name in graph.outputs}
