"""Opset-aware conversion of one ONNX node into canonical graph nodes and constants.

Assumes: the node's op is supported (the importer checks first) and its inputs' types are
known in `ctx.types` (nodes are converted in topological order). Guarantees: the output
is in the LATEST-opset form the op registry expects:
  - Constant -> a graph constant (value, value_float(s), value_int(s)); no node.
  - Reduce* with an `axes` attribute (opset < 18) -> `axes` as an int64 constant input
    (also Squeeze/Unsqueeze `axes` attributes, a pre-13 form some exporters still emit).
  - Split with a legacy `split` attribute -> input; with neither `split` input nor
    `num_outputs` -> `num_outputs = len(outputs)`.
  - ConstantOfShape's tensor `value` -> scalar attrs `value` (Python scalar) and `dtype`.
  - Cast's `to` (an ONNX element type) -> a dtype name; CastLike -> Cast.
  - Optional trailing outputs nobody reads (LayerNormalization Mean/InvStdDev, Dropout
    mask, MaxPool Indices, BatchNormalization running stats) are dropped; trailing ""
    outputs are stripped from every node.
Attributes become hashable Python values; tensor attributes elsewhere are refused.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx.tensors import dtype_name
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.ops.reduce import REDUCERS


@dataclass(frozen=True)
class OnnxNode:
    """A decoded ONNX node: attributes already Python values (tensors as ndarrays)."""
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    name: str
    attrs: Mapping[str, Any]


@dataclass
class Context:
    """What a handler may consult: the opset, known types, which values are read."""
    opset: int
    types: Mapping[str, TensorType]
    used: set[str]
    taken: set[str] = field(default_factory=set)

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


def _label(node: OnnxNode) -> str:
    return f"node '{node.name}' ({node.op})"


def _no_tensor_attrs(node: OnnxNode, attrs: Mapping[str, Any]) -> None:
    for key, value in attrs.items():
        if isinstance(value, np.ndarray):
            raise ModelError(f"{_label(node)}: tensor attribute '{key}' is not supported")


def _outputs(node: OnnxNode, ctx: Context) -> tuple[str, ...]:
    outputs = list(node.outputs)
    if node.op in OPTIONAL_OUTPUT_OPS:
        outputs = outputs[:1] + [o if o in ctx.used else "" for o in outputs[1:]]
    while outputs and not outputs[-1]:
        outputs.pop()
    return tuple(outputs)


def emit(node: OnnxNode, ctx: Context, op: str | None = None, inputs=None,
         constants: Mapping[str, np.ndarray] | None = None, **attrs: Any) -> Converted:
    """One canonical node built from `node` with optional overrides."""
    merged = {**node.attrs, **attrs}
    merged = {k: v for k, v in merged.items() if v is not None}
    _no_tensor_attrs(node, merged)
    ins = tuple(node.inputs if inputs is None else inputs)
    while ins and not ins[-1]:
        ins = ins[:-1]
    made = Node.make(op or node.op, ins, _outputs(node, ctx), node.name, **merged)
    return Converted((made,), dict(constants or {}))


def _default(node: OnnxNode, ctx: Context) -> Converted:
    return emit(node, ctx)


def _scalar_array(value: Any, dtype: str) -> np.ndarray:
    return np.array(value, dtype=dtype)


CONSTANT_ATTRS = {
    "value_float": lambda v: _scalar_array(v, "float32"),
    "value_floats": lambda v: _scalar_array(list(v), "float32"),
    "value_int": lambda v: _scalar_array(v, "int64"),
    "value_ints": lambda v: _scalar_array(list(v), "int64"),
}


def _constant(node: OnnxNode, ctx: Context) -> Converted:
    if len(node.attrs) != 1:
        raise ModelError(f"{_label(node)}: expected exactly one value attribute, got "
                         f"{sorted(node.attrs) or 'none'}")
    (key, value), = node.attrs.items()
    if key == "value" and isinstance(value, np.ndarray):
        array = value
    elif key in CONSTANT_ATTRS:
        array = CONSTANT_ATTRS[key](value)
    else:
        raise ModelError(f"{_label(node)}: attribute '{key}' is not supported")
    return Converted((), {node.outputs[0]: array})


def _constant_of_shape(node: OnnxNode, ctx: Context) -> Converted:
    value = node.attrs.get("value")
    if value is None:
        return emit(node, ctx, value=0.0, dtype="float32")
    if not isinstance(value, np.ndarray) or value.size != 1:
        raise ModelError(f"{_label(node)}: attribute 'value' must be a one-element tensor")
    return emit(node, ctx, value=value.reshape(()).item(), dtype=str(value.dtype))


def _cast(node: OnnxNode, ctx: Context) -> Converted:
    to = dtype_name(int(node.attrs.get("to", 0)), f"{_label(node)} attribute 'to'")
    return emit(node, ctx, to=to)


def _cast_like(node: OnnxNode, ctx: Context) -> Converted:
    target = ctx.types[node.inputs[1]].dtype
    attrs = {k: v for k, v in node.attrs.items() if k != "saturate"}
    made = OnnxNode("Cast", node.inputs[:1], node.outputs, node.name, attrs)
    return emit(made, ctx, to=target)


def _axes_attr_to_input(node: OnnxNode, ctx: Context, index: int, key: str) -> Converted:
    """Move an int-list attribute `key` to input `index` as an int64 constant."""
    values = node.attrs.get(key)
    attrs = {k: v for k, v in node.attrs.items() if k != key}
    if values is None:
        return emit(OnnxNode(node.op, node.inputs, node.outputs, node.name, attrs), ctx)
    name = ctx.fresh(f"{node.name or node.outputs[0]}/{key}")
    inputs = list(node.inputs[:index]) + [""] * (index - len(node.inputs[:index])) + [name]
    inputs += list(node.inputs[index + 1:])
    made = OnnxNode(node.op, tuple(inputs), node.outputs, node.name, attrs)
    return emit(made, ctx, constants={name: np.array(values, dtype=np.int64)})


def _attr_input(key: str, index: int) -> Handler:
    """Handler for ops whose int-list attribute `key` became input `index` (Reduce* axes
    at opset 18; older forms of Squeeze/Unsqueeze axes and Split split, accepted too)."""
    return lambda node, ctx: _axes_attr_to_input(node, ctx, index, key)


def _split(node: OnnxNode, ctx: Context) -> Converted:
    if "split" in node.attrs:
        return _axes_attr_to_input(node, ctx, 1, "split")
    has_input = len(node.inputs) > 1 and node.inputs[1]
    if not has_input and "num_outputs" not in node.attrs:
        return emit(node, ctx, num_outputs=len(node.outputs))
    return emit(node, ctx)


HANDLERS: dict[str, Handler] = {
    "Constant": _constant,
    "ConstantOfShape": _constant_of_shape,
    "Cast": _cast,
    "CastLike": _cast_like,
    "Split": _split,
    "Squeeze": _attr_input("axes", 1),
    "Unsqueeze": _attr_input("axes", 1),
    **{name: _attr_input("axes", 1) for name in REDUCERS},
}


def convert(node: OnnxNode, ctx: Context) -> Converted:
    """Canonical nodes and new constants for one ONNX node."""
    return HANDLERS.get(node.op, _default)(node, ctx)


def supported_extra_ops() -> tuple[str, ...]:
    """ONNX op types the importer accepts beyond the op registry's."""
    return ("Constant", "CastLike")
