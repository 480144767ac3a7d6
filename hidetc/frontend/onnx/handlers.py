"""Opset-aware conversion of one ONNX node into canonical graph nodes and constants.

Assumes: the node's op is supported and its schema version is one the handlers read
(the importer checks both first: `versions.py`), and its inputs' types are known in
`ctx.types` (nodes are converted in topological order). Guarantees: the output is in
the LATEST-opset form the op registry expects:
  - Constant -> a graph constant (value, value_float(s), value_int(s)); no node.
  - Reduce* with an `axes` attribute (opset < 18) -> `axes` as an int64 constant input
    (also Squeeze/Unsqueeze `axes` attributes, their form before opset 13).
  - Split with a legacy `split` attribute (before 13) -> input; with neither `split`
    input nor `num_outputs` -> `num_outputs = len(outputs)`.
  - ConstantOfShape's tensor `value` -> scalar attrs `value` (Python scalar) and `dtype`.
  - Cast's `to` (an ONNX element type) -> a dtype name; CastLike -> Cast; `saturate`
    and `round_mode` (float8 targets only, which are refused) are dropped.
  - the other opset 7..12 forms (Upsample read as a Resize): `legacy.py`; what
    opsets 22..28 changed and the new ops read as decompositions (RMSNormalization,
    Swish, SwiGLU): `recent.py`.
  - Optional trailing outputs nobody reads (LayerNormalization Mean/InvStdDev, Dropout
    mask, MaxPool Indices, BatchNormalization running stats) are dropped; trailing ""
    outputs are stripped from every node.
Attributes become hashable Python values; tensor attributes elsewhere are refused.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx import (
    attention,
    control_flow,
    deform_conv,
    einsum,
    extra_ops,
    legacy,
    linalg,
    losses,
    normalization,
    optional,
    quantization,
    recent,
    recurrent,
    spatial,
    tfidf,
    training,
    transposed_conv,
)
from hidetc.frontend.onnx.base import (
    OPTIONAL_OUTPUT_OPS,
    Context,
    Converted,
    Handler,
    OnnxNode,
    emit,
    label,
)
from hidetc.frontend.onnx.tensors import dtype_name
from hidetc.graph.ir import NARROW_DTYPES
from hidetc.graph.ops.reduce import REDUCERS
from hidetc.graph.ops.registry import REGISTRY

__all__ = ["OPTIONAL_OUTPUT_OPS", "Context", "Converted", "OnnxNode", "convert", "emit",
           "supported_extra_ops"]
CAST_FLOAT8_ATTRS = ("saturate", "round_mode")


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
        raise ModelError(f"{label(node)}: expected exactly one value attribute, got "
                         f"{sorted(node.attrs) or 'none'}")
    (key, value), = node.attrs.items()
    if key == "value" and isinstance(value, np.ndarray):
        array = value
    elif key in CONSTANT_ATTRS:
        array = CONSTANT_ATTRS[key](value)
    else:
        raise ModelError(f"{label(node)}: attribute '{key}' is not supported")
    return Converted((), {node.outputs[0]: array})


def _constant_of_shape(node: OnnxNode, ctx: Context) -> Converted:
    value = node.attrs.get("value")
    if value is None:
        return emit(node, ctx, value=0.0, dtype="float32")
    if not isinstance(value, np.ndarray) or value.size != 1:
        raise ModelError(f"{label(node)}: attribute 'value' must be a one-element tensor")
    return emit(node, ctx, value=value.reshape(()).item(), dtype=str(value.dtype))


def _cast_attrs(node: OnnxNode, to: str) -> OnnxNode:
    """`saturate`/`round_mode` are kept for the narrow targets they concern only."""
    return node if to in NARROW_DTYPES else node.without(*CAST_FLOAT8_ATTRS)


def _cast(node: OnnxNode, ctx: Context) -> Converted:
    to = dtype_name(int(node.attrs.get("to", 0)), f"{label(node)} attribute 'to'")
    return emit(_cast_attrs(node, to), ctx, to=to)


def _bitcast(node: OnnxNode, ctx: Context) -> Converted:
    return emit(node, ctx, to=dtype_name(int(node.attrs.get("to", 0)),
                                         f"{label(node)} attribute 'to'"))


def _cast_like(node: OnnxNode, ctx: Context) -> Converted:
    target = ctx.types[node.inputs[1]].dtype
    made = OnnxNode("Cast", node.inputs[:1], node.outputs, node.name,
                    _cast_attrs(node, target).attrs)
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
    "BitCast": _bitcast,
    "CastLike": _cast_like,
    "Split": _split,
    "Squeeze": _attr_input("axes", 1),
    "Unsqueeze": _attr_input("axes", 1),
    **{name: _attr_input("axes", 1) for name in REDUCERS},
}
# Modules of decompositions and opset conversions, one family each: HANDLERS (op ->
# handler), EXTRA_OPS (ONNX ops read only as decompositions), CHECKED/FIRST_VERSION
# (their reviewed schema versions, merged into versions.py's), optionally VALUE_INPUTS
# (the input slots whose values the import needs: onnx_backend specializes them).
# control_flow's ops (If/Loop/Scan) are expanded by the importer itself.
DECOMPOSERS = (legacy, recent, control_flow, attention, losses, normalization, einsum, quantization,
               recurrent, spatial, transposed_conv, extra_ops, training, optional, linalg,
               deform_conv, tfidf)
for _module in DECOMPOSERS:
    overlap = set(_module.HANDLERS) & set(HANDLERS)
    assert not overlap, f"{_module.__name__} handles {sorted(overlap)} a second time"
    HANDLERS.update(_module.HANDLERS)


def convert(node: OnnxNode, ctx: Context) -> Converted:
    """Canonical nodes and new constants for one ONNX node."""
    return HANDLERS.get(node.op, _default)(node, ctx)


def supported_extra_ops() -> tuple[str, ...]:
    """ONNX op types the importer accepts beyond the op registry's."""
    upsample = ("Upsample",) if "Resize" in REGISTRY else ()   # read as a Resize
    extra = tuple(op for module in DECOMPOSERS for op in module.EXTRA_OPS)
    return ("Constant", "CastLike") + extra + upsample
