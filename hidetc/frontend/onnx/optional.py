"""OptionalHasElement and OptionalGetElement where optionals reduce to plain tensors.

hidetc's graphs hold tensors only (an optional- or sequence-typed graph input or value
is refused where it is declared), so an optional reaching these ops is either a tensor
or omitted:
  - OptionalHasElement: true for a tensor input, false for an omitted one (no input or
    the empty name): a bool scalar constant.
  - OptionalGetElement: the tensor itself (Identity); an omitted input is an error (the
    ONNX spec leaves getting an element from an empty optional undefined).
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx.base import Context, Converted, OnnxNode, emit, label


def has_element(node: OnnxNode, ctx: Context) -> Converted:
    return Converted((), {node.outputs[0]: np.array(bool(node.input(0)))})


def get_element(node: OnnxNode, ctx: Context) -> Converted:
    if not node.input(0):
        raise ModelError(f"{label(node)}: the optional input is empty (no element to get)")
    return emit(node, ctx, op="Identity")


HANDLERS = {"OptionalHasElement": has_element, "OptionalGetElement": get_element}
EXTRA_OPS: tuple[str, ...] = ("OptionalHasElement", "OptionalGetElement")
# Both born in opset 15; versions 18 and later only widened the type lists.
CHECKED: tuple[str, ...] = EXTRA_OPS
FIRST_VERSION: dict[str, int] = {"OptionalHasElement": 15, "OptionalGetElement": 15}
