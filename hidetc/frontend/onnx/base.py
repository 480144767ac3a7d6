"""The pieces every ONNX node handler uses: the decoded node, the import context, the
result type, `emit` (one canonical node) and `Builder` (several, for decompositions).

Assumes: handlers run in topological order, so `ctx.types` holds every input's type
and `ctx.values` every input value known at import time (constants, folded shape
chains). Guarantees: `emit` and `Builder` produce `Node`s with hashable attributes and
no tensor attributes; values a `Builder` invents get fresh names (`ctx.fresh`) that
clash with no ONNX value name; optional trailing outputs nobody reads are dropped for
the ops in `OPTIONAL_OUTPUT_OPS`, and trailing "" outputs/inputs are stripped.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from hidetc.errors import ModelError
from hidetc.graph.ir import Node, TensorType


@dataclass(frozen=True)
class OnnxNode:
    """A decoded ONNX node: attributes already Python values (tensors as ndarrays)."""
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    name: str
    attrs: Mapping[str, Any]
    implicit: tuple[str, ...] = ()   # values its subgraphs read from enclosing scopes
    source: Any = field(default=None, compare=False, repr=False)   # the NodeProto

    def without(self, *keys: str) -> "OnnxNode":
        """The same node without the attributes `keys`."""
        attrs = {k: v for k, v in self.attrs.items() if k not in keys}
        return OnnxNode(self.op, self.inputs, self.outputs, self.name, attrs, self.implicit,
                        self.source)

    def input(self, index: int) -> str:
        """Input `index`, or "" when it is omitted."""
        return self.inputs[index] if index < len(self.inputs) else ""


@dataclass
class Context:
    """What a handler may consult: the model's default-domain opset, known types and
    known values (by value name), which values are read, and names already taken."""
    opset: int
    types: Mapping[str, TensorType]
    used: set[str]
    taken: set[str] = field(default_factory=set)
    values: Mapping[str, np.ndarray] = field(default_factory=dict)

    def fresh(self, base: str) -> str:
        name, count = base, 0
        while name in self.taken or name in self.types:
            count += 1
            name = f"{base}_{count}"
        self.taken.add(name)
        return name


@dataclass(frozen=True)
class Converted:
    nodes: tuple[Node, ...] = ()
    constants: Mapping[str, np.ndarray] = field(default_factory=dict)


Handler = Callable[[OnnxNode, Context], Converted]
OPTIONAL_OUTPUT_OPS = ("LayerNormalization", "Dropout", "MaxPool", "BatchNormalization")


def label(node: OnnxNode) -> str:
    return f"node '{node.name}' ({node.op})"


def _no_tensor_attrs(node: OnnxNode, attrs: Mapping[str, Any]) -> None:
    for key, value in attrs.items():
        if isinstance(value, np.ndarray):
            raise ModelError(f"{label(node)}: tensor attribute '{key}' is not supported")


def _outputs(node: OnnxNode, ctx: Context) -> tuple[str, ...]:
    outputs = list(node.outputs)
    if node.op in OPTIONAL_OUTPUT_OPS:
        outputs = outputs[:1] + [o if o in ctx.used else "" for o in outputs[1:]]
    while outputs and not outputs[-1]:
        outputs.pop()
    return tuple(outputs)


def emit(node: OnnxNode, ctx: Context, op: str | None = None, inputs=None,
         constants: Mapping[str, np.ndarray] | None = None, **attrs: Any) -> Converted:
    """One canonical node built from `node` with optional overrides (an attribute
    overridden with None is dropped)."""
    merged = {**node.attrs, **attrs}
    merged = {k: v for k, v in merged.items() if v is not None}
    _no_tensor_attrs(node, merged)
    ins = tuple(node.inputs if inputs is None else inputs)
    while ins and not ins[-1]:
        ins = ins[:-1]
    made = Node.make(op or node.op, ins, _outputs(node, ctx), node.name, **merged)
    return Converted((made,), dict(constants or {}))


def ints_attr(node: OnnxNode, key: str, default: list[int], length: int) -> list[int]:
    """An int-list attribute (or `default`) of exactly `length` values, else ModelError."""
    values = [int(v) for v in node.attrs.get(key, default)]
    if len(values) != length:
        raise ModelError(f"{label(node)}: attribute '{key}' has {len(values)} values, "
                         f"expected {length}")
    return values


def scalar(value: Any, dtype: str) -> np.ndarray:
    """A 0-d array of `dtype` (any name in `ir.DTYPES`, bfloat16 included)."""
    return np.asarray(np.array(value).astype(np.dtype(dtype)))


class Builder:
    """Several canonical nodes standing for one ONNX node (a decomposition).

    Intermediate values are named "<node name or first output>/<what>" (made unique);
    the last node should write the ONNX node's own output (`out=`), so that consumers
    and graph outputs see the name they expect."""

    def __init__(self, node: OnnxNode, ctx: Context):
        self.node, self.ctx = node, ctx
        self.base = node.name or node.outputs[0]
        self.nodes: list[Node] = []
        self.constants: dict[str, np.ndarray] = {}

    def const(self, what: str, array: np.ndarray) -> str:
        name = self.ctx.fresh(f"{self.base}/{what}")
        array = np.asarray(array)
        # (np.ascontiguousarray would turn a 0-d array into shape [1])
        self.constants[name] = array if array.ndim == 0 else np.ascontiguousarray(array)
        return name

    def add(self, op: str, inputs: Iterable[str], out: str | None = None, **attrs: Any
            ) -> str:
        """Append `op(inputs)`; returns its (only) output's name."""
        out = out or self.ctx.fresh(f"{self.base}/{op}")
        name = self.node.name if out in self.node.outputs else out
        attrs = {k: v for k, v in attrs.items() if v is not None}
        self.nodes.append(Node.make(op, tuple(inputs), (out,), name, **attrs))
        return out

    def done(self) -> Converted:
        return Converted(tuple(self.nodes), dict(self.constants))
