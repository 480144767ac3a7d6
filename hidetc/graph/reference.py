"""The numpy interpreter of a whole graph: the oracle every later stage is tested against.

Assumes: `graph.nodes` are in topological order and `graph.types` covers every value.
Guarantees: user inputs are validated (names, dtypes, shapes) with one-line
`InputError`s; nodes run in order through `evaluate_node`; a value is dropped right after
its last use; every computed value is checked against its declared type (a mismatch is
a bug in an op definition or a pass, reported as RuntimeError). Returns the graph
outputs by name, in `graph.outputs` order.

`exact=True` is the model at its own precision without the rounding of its arithmetic:
every node computes on its float inputs widened to float64 and its results are rounded
once to their declared types (a Cast to float16 still rounds, as the model says; a
float16 MatMul does not round its partial sums). It is the yardstick verification falls
back on when two engines disagree (`hidetc.driver.verify.settle`). Ops that read a
float's bits (`BIT_OPS`), and any node whose reference refuses float64, run as declared.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from hidetc.errors import InputError
from hidetc.graph.evaluate import evaluate_node
from hidetc.graph.ir import FLOAT_DTYPES, NARROW_DTYPES, Graph, TensorType


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


BIT_OPS = frozenset({"BitCast"})
# every float type narrower than float64: numpy's, bfloat16 and the 8/4-bit floats
WIDENED = frozenset(d for d in (*FLOAT_DTYPES, *NARROW_DTYPES)
                    if d.startswith(("float", "bfloat")) and d != "float64")


def _widened(node, args: list) -> list | None:
    """`args` with every float array widened to float64; None when there is none to widen
    or the op reads bits."""
    if node.op in BIT_OPS:
        return None
    floats = [a is not None and a.dtype.name in WIDENED for a in args]
    if not any(floats):
        return None
    return [a.astype(np.float64) if wide else a for a, wide in zip(args, floats)]


def _exact_node(node, args: list, types: list) -> list:
    """The node's outputs computed on widened inputs, rounded to their declared types."""
    widened = _widened(node, args)
    if widened is None:
        return evaluate_node(node, args)
    try:
        results = evaluate_node(node, widened)
    except Exception:  # noqa: BLE001  (a reference that takes its declared types only)
        return evaluate_node(node, args)
    return [r if r is None or t is None or str(r.dtype) == t.dtype else
            np.asarray(r).astype(t.dtype) for r, t in zip(results, types)]


def run_graph(graph: Graph, inputs: Mapping[str, np.ndarray],
              check_types: bool = True, keep_all: bool = False,
              exact: bool = False) -> dict[str, np.ndarray]:
    """Run `graph` on `inputs` with the numpy references; return its outputs by name
    (`keep_all`: every value it computed, the inputs and constants too; `exact`: each
    node in float64, rounded to its declared types -- see the module docstring)."""
    env: dict[str, np.ndarray] = dict(graph.constants)
    env.update(check_inputs(graph, inputs))
    keep = set(graph.outputs)
    if keep_all:
        keep.update(o for node in graph.nodes for o in node.outputs if o)
    last = _last_uses(graph)
    for index, node in enumerate(graph.nodes):
        args = [env[name] if name else None for name in node.inputs]
        results = (_exact_node(node, args, [graph.types.get(o) for o in node.outputs])
                   if exact else evaluate_node(node, args))
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
