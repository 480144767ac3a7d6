"""Apply one op definition to one node: shape/dtype inference and numpy evaluation.

Assumes: `node.op` is in the op registry (importing this module registers every op).
Guarantees: `infer_node` returns exactly one entry per `node.outputs` (None only for
an omitted output, named "", that the op does not produce); a node that names more outputs than the
op produces (e.g. LayerNormalization's Mean) is a ShapeError. Every ShapeError or
ValueError from an op is re-raised as a ShapeError whose one-line message starts with
"node '<name>' (<Op>): ". `evaluate_node` returns one ndarray per output, in the dtype
the op's rule promises, under numpy's floating-point warnings silenced (inf/nan are
results, not errors).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

import hidetc.graph.ops  # noqa: F401  (registers every op)
from hidetc.errors import ShapeError
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.ops.misc import shape_value
from hidetc.graph.ops.registry import get_op

TYPE_VALUED_OPS = ("Shape", "Size")


def _label(node: Node) -> str:
    return f"node '{node.name or '?'}' ({node.op})"


def _message(node: Node, error: Exception) -> str:
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    prefix = f"{node.op}: "
    return f"{_label(node)}: {text[len(prefix):] if text.startswith(prefix) else text}"


def _fit_outputs(node: Node, produced: Sequence, what: str) -> list:
    count = len(node.outputs)
    if count > len(produced):
        extra = [o for o in node.outputs[len(produced):] if o]
        if extra:
            raise ShapeError(f"{_label(node)}: output {node.outputs.index(extra[0])} "
                             f"('{extra[0]}') is not supported; the op {what} "
                             f"{len(produced)} output(s)")
        return list(produced) + [None] * (count - len(produced))
    return list(produced[:count])


def infer_node(node: Node, types: Sequence[Optional[TensorType]],
               values: Sequence[Optional[np.ndarray]] | None = None) -> list[TensorType]:
    """Output types of `node` given its input types (None = omitted) and known values."""
    values = list(values) if values is not None else [None] * len(types)
    try:
        result = get_op(node.op).infer(list(types), node.attr_dict, values)
    except (ShapeError, ValueError) as error:
        raise ShapeError(_message(node, error)) from None
    return _fit_outputs(node, result, "produces")


def evaluate_node(node: Node, inputs: Sequence[Optional[np.ndarray]]) -> list[np.ndarray]:
    """Compute the outputs of `node` with the numpy reference."""
    try:
        with np.errstate(all="ignore"):
            result = get_op(node.op).reference(list(inputs), node.attr_dict)
    except (ShapeError, ValueError) as error:
        raise ShapeError(_message(node, error)) from None
    return [None if r is None else np.asarray(r) for r in _fit_outputs(node, result, "computes")]


def type_values(node: Node, types: Sequence[Optional[TensorType]]) -> list[np.ndarray] | None:
    """Values of a Shape/Size node known from its input type alone, else None."""
    if node.op not in TYPE_VALUED_OPS or not types or types[0] is None:
        return None
    return [shape_value(node.op, types[0], node.attr_dict)]
