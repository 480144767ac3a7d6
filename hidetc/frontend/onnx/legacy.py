"""Handlers for the opset 7..12 forms that differ from the latest ones (older schemas are
refused by `versions.py`). Each converts to the latest form the op catalogue expects, or
raises a one-line error naming the op, its version and what is not supported:

  - Softmax/LogSoftmax/Hardmax < 13: `axis` (default 1) COERCES the input to 2-D
    [d0*..*d(axis-1), d(axis)*..*d(n-1)] and normalizes each row: read as Flatten(axis) ->
    op(axis=1) -> Reshape(original shape); a plain op(axis) when axis is the last one.
  - Pad < 11: `pads`, `value` attributes -> inputs (pads int64, value in the data dtype).
  - Clip < 11: `min`, `max` attributes -> inputs in the input's dtype.
  - Slice < 10: `starts`, `ends`, `axes` attributes -> int64 inputs (no steps).
  - BatchNormalization < 14: `spatial` (BN-7, opset 7-8) is dropped when 1 and refused
    when 0 (per-activation statistics); more than one output means training mode
    (batch statistics): refused, the catalogue computes inference only.
  - Dropout < 12: the `ratio` attribute (training only) is dropped; the mask output is
    refused when read: its inference value is not defined before Dropout-12 (ONNX
    Runtime returns all false, zeros typed like the data for Dropout-7; the ONNX
    reference all true).
  - OneHot < 11: a negative index selects no class (all `off` values) where OneHot-11
    counts it from the end: negative indices are replaced by `depth` (out of range).
  - Resize-10 (X, scales) and Upsample-7/9/10 (scales attribute at 7, input from 9)
    -> Resize(X, "", scales) with coordinate_transformation_mode=asymmetric: the
    output size is floor(in * scale) as in every Resize; positions map x / scale, and
    nearest rounds down when upsampling, up when downsampling (what ONNX Runtime does
    for these versions; an exact np.repeat for integer upsampling scales, the ONNX
    reference's Upsample). Nearest scales that enlarge one axis and shrink another are
    refused.
The axes attribute forms of Reduce*, Squeeze/Unsqueeze and Split are read in
`handlers.py` (they are also what some exporters still emit at newer opsets).
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ModelError, UnsupportedOpError
from hidetc.frontend.onnx import training
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, emit, label, scalar


def _int64(values) -> np.ndarray:
    return np.array(list(values), dtype=np.int64)


def _attrs_to_inputs(node: OnnxNode, ctx: Context, keys: tuple[str, ...],
                     arrays: dict[str, np.ndarray]) -> Converted:
    """Emit `node` with the attributes `keys` moved to inputs 1.. (in that order); a key
    missing from `arrays` becomes an omitted input."""
    names = {key: ctx.fresh(f"{node.name or node.outputs[0]}/{key}") for key in arrays}
    inputs = (node.inputs[0],) + tuple(names.get(k, "") for k in keys)
    constants = {names[k]: a for k, a in arrays.items()}
    return emit(node.without(*keys), ctx, inputs=inputs, constants=constants)


def softmax(node: OnnxNode, ctx: Context) -> Converted:
    if ctx.opset >= 13:
        return emit(node, ctx)
    x = ctx.types[node.inputs[0]]
    axis = int(node.attrs.get("axis", 1))
    if not -x.rank <= axis < max(x.rank, 1):
        raise ModelError(f"{label(node)}: axis {axis} is out of range for an input of rank "
                         f"{x.rank}")
    axis %= max(x.rank, 1)
    if axis >= x.rank - 1:   # the 2-D coercion keeps the last axis alone: no reshape needed
        return emit(node, ctx, axis=-1)
    build = Builder(node, ctx)
    flat = build.add("Flatten", [node.inputs[0]], axis=axis)
    normalized = build.add(node.op, [flat], axis=1)
    shape = build.const("shape", _int64(x.shape))
    build.add("Reshape", [normalized, shape], out=node.outputs[0],
              allowzero=1 if 0 in x.shape else None)
    return build.done()


def pad(node: OnnxNode, ctx: Context) -> Converted:
    if ctx.opset >= 11:
        return emit(node, ctx)
    if "pads" not in node.attrs:
        raise ModelError(f"{label(node)}: Pad-2 needs the 'pads' attribute")
    arrays = {"pads": _int64(node.attrs["pads"])}
    if "value" in node.attrs:
        arrays["value"] = scalar(float(node.attrs["value"]), ctx.types[node.inputs[0]].dtype)
    return _attrs_to_inputs(node, ctx, ("pads", "value"), arrays)


def clip(node: OnnxNode, ctx: Context) -> Converted:
    if ctx.opset >= 11:
        return emit(node, ctx)
    dtype = ctx.types[node.inputs[0]].dtype
    arrays = {k: scalar(float(node.attrs[k]), dtype) for k in ("min", "max") if k in node.attrs}
    return _attrs_to_inputs(node, ctx, ("min", "max"), arrays)


def slice_(node: OnnxNode, ctx: Context) -> Converted:
    if ctx.opset >= 10:
        return emit(node, ctx)
    missing = [k for k in ("starts", "ends") if k not in node.attrs]
    if missing:
        raise ModelError(f"{label(node)}: Slice-1 needs the '{missing[0]}' attribute")
    arrays = {k: _int64(node.attrs[k]) for k in ("starts", "ends", "axes") if k in node.attrs}
    return _attrs_to_inputs(node, ctx, ("starts", "ends", "axes"), arrays)


def batch_normalization(node: OnnxNode, ctx: Context) -> Converted:
    if ctx.opset >= 14:
        return training.batch_normalization(node, ctx)
    version = 9 if ctx.opset >= 9 else 7
    if not node.attrs.get("spatial", 1):
        raise UnsupportedOpError(f"{label(node)}: BatchNormalization-7 with spatial=0 "
                                 f"(per-activation statistics) is not supported")
    if any(node.outputs[1:]):
        raise UnsupportedOpError(f"{label(node)}: BatchNormalization-{version} with the "
                                 f"mean/var outputs runs in training mode (batch statistics), "
                                 f"which is not supported (inference only)")
    return emit(node.without("spatial"), ctx)


def dropout(node: OnnxNode, ctx: Context) -> Converted:
    if ctx.opset >= 12:
        return training.dropout(node, ctx)
    if len(node.outputs) > 1 and node.outputs[1] in ctx.used:
        version = 10 if ctx.opset >= 10 else 7
        raise UnsupportedOpError(f"{label(node)}: Dropout-{version}'s mask output is not "
                                 f"supported (undefined in inference before Dropout-12)")
    return emit(node.without("ratio"), ctx)


def one_hot(node: OnnxNode, ctx: Context) -> Converted:
    depth = ctx.values.get(node.input(1))
    dtype = ctx.types[node.inputs[0]].dtype
    if ctx.opset >= 11 or depth is None or depth.size != 1 or dtype.startswith("uint"):
        return emit(node, ctx)   # (an unknown depth is reported by the op's own check)
    build = Builder(node, ctx)
    indices = node.inputs[0]
    depth = float(depth.reshape(()))
    if float(scalar(depth, dtype)) != depth:   # depth not representable: widen the indices
        indices, dtype = build.add("Cast", [indices], to="int64"), "int64"
    negative = build.add("Less", [indices, build.const("zero", scalar(0, dtype))])
    beyond = build.const("depth", scalar(depth, dtype))
    indices = build.add("Where", [negative, beyond, indices])
    build.nodes += emit(node, ctx, inputs=(indices,) + node.inputs[1:]).nodes
    return build.done()


def _as_resize(node: OnnxNode, ctx: Context, scales: str, version: str,
               constants: dict[str, np.ndarray] | None = None) -> Converted:
    mode = node.attrs.get("mode", "nearest")
    if mode not in ("nearest", "linear"):
        raise ModelError(f"{label(node)}: {version} mode '{mode}' is not nearest or linear")
    known = (constants or {}).get(scales, ctx.values.get(scales))
    rounding = "floor"
    if known is not None and mode == "nearest":
        factors = np.asarray(known, dtype=np.float64).ravel()
        if (factors < 1).any() and (factors > 1).any():
            raise UnsupportedOpError(f"{label(node)}: {version} nearest with scales "
                                     f"{factors.tolist()} both enlarging and shrinking axes "
                                     f"is not supported")
        rounding = "ceil" if (factors < 1).any() else "floor"
    return emit(node.without("mode", "scales"), ctx, op="Resize",
                inputs=(node.inputs[0], "", scales), constants=constants, mode=mode,
                coordinate_transformation_mode="asymmetric", nearest_mode=rounding)


def resize(node: OnnxNode, ctx: Context) -> Converted:
    if ctx.opset >= 11:
        return emit(node, ctx)
    return _as_resize(node, ctx, node.input(1), "Resize-10")


def upsample(node: OnnxNode, ctx: Context) -> Converted:
    if ctx.opset >= 9:
        return _as_resize(node, ctx, node.input(1), "Upsample-9")
    if "scales" not in node.attrs:
        raise ModelError(f"{label(node)}: Upsample-7 needs the 'scales' attribute")
    name = ctx.fresh(f"{node.name or node.outputs[0]}/scales")
    scales = np.array(list(node.attrs["scales"]), dtype=np.float32)
    return _as_resize(node, ctx, name, "Upsample-7", {name: scales})


HANDLERS = {
    "Softmax": softmax,
    "LogSoftmax": softmax,
    "Hardmax": softmax,
    "Pad": pad,
    "Clip": clip,
    "Slice": slice_,
    "BatchNormalization": batch_normalization,
    "Dropout": dropout,
    "OneHot": one_hot,
    "Resize": resize,
    "Upsample": upsample,
}
# The DECOMPOSERS interface (handlers.py); Upsample's scales shape its output, so the
# backend binds them at compile time.
EXTRA_OPS: tuple[str, ...] = ()
CHECKED: tuple[str, ...] = ()
FIRST_VERSION: dict[str, int] = {}
VALUE_INPUTS: dict[str, tuple[int, ...]] = {"Upsample": (1,)}
