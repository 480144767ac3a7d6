"""Ops hidetc has no handler for, read through the function body their ONNX schema
defines (the definition the `_expanded` node tests inline): the generic fallback that
reads AffineGrid, CenterCropPad, LinearAttention, CausalConvWithState... and any op a
newer onnx defines as a function of ops hidetc reads.

- `has_function(op, opset, domain)`: the op's schema at `opset` has a function body (a
  plain one, or a context-dependent one built from the node's attributes and input
  types) for a version at most `opset`; default domain and ai.onnx.preview
  (`FUNCTION_DOMAINS`, each with the model's opset for that domain).
- `expand(node, opset, input_types, tag, decode)`: the body's nodes for this node: the
  newest body version <= opset; attribute references resolved from the node's
  attributes, else the schema's default, else dropped (the inner op's default applies);
  function inputs/outputs bound to the node's (omitted ones to ""), every other name
  prefixed with `tag` (fresh); subgraph attributes of body nodes keep resolving the
  function's names through `control_flow.Subgraph.outer`.
Assumes the importer splices the result into its worklist (so nested functions and
control flow expand in turn) and checks the spliced ops are supported. Guarantees
ModelError naming the node when onnx cannot build the body.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Callable, Sequence

import numpy as np
import onnx
from onnx import helper

from hidetc.errors import ModelError
from hidetc.frontend.onnx.base import OnnxNode, label
from hidetc.frontend.onnx.control_flow import needed_values, renamed
from hidetc.graph.ir import TensorType

Decode = Callable[[onnx.NodeProto, str], OnnxNode]


# Domains whose function-bodied ops are read (ai.onnx.preview: FlexAttention...).
FUNCTION_DOMAINS = ("", "ai.onnx", "ai.onnx.preview")


@lru_cache(maxsize=None)
def _schema(op: str, opset: int, domain: str = "") -> onnx.defs.OpSchema | None:
    try:
        return onnx.defs.get_schema(op, opset, "" if domain == "ai.onnx" else domain)
    except onnx.defs.SchemaError:
        return None


def _version(op: str, opset: int, domain: str = "") -> tuple[int, bool] | None:
    """(function opset version, context dependent?) of the newest body <= opset."""
    if domain not in FUNCTION_DOMAINS or not opset:
        return None
    schema = _schema(op, opset, domain)
    if schema is None:
        return None
    found = [(v, False) for v in schema.function_opset_versions if v <= opset]
    found += [(v, True) for v in schema.context_dependent_function_opset_versions
              if v <= opset]
    return max(found) if found else None


def has_function(op: str, opset: int, domain: str = "") -> bool:
    return _version(op, opset, domain) is not None


def _type_proto(t: TensorType | None) -> onnx.TypeProto:
    if t is None:
        return onnx.TypeProto()
    elem = onnx.TensorProto.BFLOAT16 if t.dtype == "bfloat16" else \
        helper.np_dtype_to_tensor_dtype(np.dtype(t.dtype))
    return helper.make_tensor_type_proto(elem, list(t.shape))


def _body(node: OnnxNode, opset: int, input_types: Sequence[TensorType | None]
          ) -> onnx.FunctionProto:
    domain = node.source.domain
    version, dependent = _version(node.op, opset, domain)
    schema = _schema(node.op, opset, domain)
    function = onnx.FunctionProto()
    try:
        if dependent:
            made = schema.get_context_dependent_function_with_opset_version(
                version, node.source.SerializeToString(),
                [_type_proto(t).SerializeToString() for t in input_types])
        else:
            made = schema.get_function_with_opset_version(version)
        function.ParseFromString(made)
    except Exception as error:  # noqa: BLE001 - onnx's builders raise various types
        raise ModelError(f"{label(node)}: onnx could not build the function body of "
                         f"{node.op}-{version}: {error}") from None
    if not function.node:
        raise ModelError(f"{label(node)}: onnx gives no function body for {node.op}-{version} "
                         f"with these attributes and input types")
    return function


def _resolve_attributes(inner: onnx.NodeProto, given: dict[str, onnx.AttributeProto]
                        ) -> onnx.NodeProto:
    made = onnx.NodeProto()
    made.CopyFrom(inner)
    del made.attribute[:]
    for attr in inner.attribute:
        if attr.ref_attr_name:
            if attr.ref_attr_name in given:
                value = onnx.AttributeProto()
                value.CopyFrom(given[attr.ref_attr_name])
                value.name = attr.name
                made.attribute.append(value)
        else:
            made.attribute.append(attr)
    return made


def expand(node: OnnxNode, opset: int, input_types: Sequence[TensorType | None], tag: str,
           fresh: Callable[[str], str], decode: Decode) -> list[OnnxNode]:
    function = _body(node, opset, input_types)
    given = {a.name: a for a in node.source.attribute}
    for default in function.attribute_proto:
        given.setdefault(default.name, default)
    schema = _schema(node.op, opset, node.source.domain)
    for name, attr in schema.attributes.items():
        if name not in given and attr.default_value and attr.default_value.type:
            given[name] = attr.default_value
    names = {}
    for index, name in enumerate(function.input):
        names[name] = node.inputs[index] if index < len(node.inputs) else ""
    for index, name in enumerate(function.output):
        if index < len(node.outputs) and node.outputs[index]:
            names[name] = node.outputs[index]
    for inner in function.node:
        for out in inner.output:
            if out and out not in names:
                names[out] = fresh(f"{tag}/{out}")
    return [renamed(decode(_resolve_attributes(inner, given),
                           f"{tag}/{inner.name or f'{inner.op_type}_{index}'}"), names)
            for index, inner in enumerate(function.node)]


@lru_cache(maxsize=None)
def value_slots(op: str, opset: int) -> tuple[int, ...]:
    """Inputs of a function-bodied op whose values its body needs at compile time (they
    reach a catalogue op's value input inside the body); plain bodies only (a
    context-dependent body depends on the node)."""
    from hidetc.graph.ops import REGISTRY
    found = _version(op, opset)
    if found is None or found[1]:
        return ()
    function = onnx.FunctionProto()
    function.ParseFromString(_schema(op, opset).get_function_with_opset_version(found[0]))
    seeds = [n.input[k] for n in function.node if n.op_type in REGISTRY
             for k in REGISTRY[n.op_type].value_inputs if k < len(n.input) and n.input[k]]
    needed = needed_values(function.node, seeds)
    return tuple(k for k, name in enumerate(function.input) if name in needed)
