"""Handlers for what opsets 22..28 changed in ops hidetc reads, and for the new ops that
are clean decompositions into catalogue ops.

Changed semantics (checked against onnx 1.23's schema history; the other changes of
these opsets only widened type lists: bfloat16 (22), float8 (22), float4e2m1 (23),
float8e8m0 (24), int2/uint2 (25), float6 (28), which `tensors.dtype_name` reads or
refuses wherever a tensor or a Cast target enters the graph):
  - SpaceToDepth-28: `mode` DCR (the default, the old behaviour: passed through without
    the attribute) or CRD, read as Reshape [n,c,h/b,b,w/b,b] -> Transpose
    [0,1,3,5,2,4] -> Reshape [n,c*b*b,h/b,w/b].
  - Mod-28: fmod=0 is defined for floats too (A - floor(A/B)*B, numpy's `mod`): read
    as numpy computes it, r = Mod(A, B, fmod=1); r + B where r != 0 and its sign
    differs from B's; a zero result takes B's sign. (Before 28 a float fmod=0 is
    invalid and left to the catalogue's check.)
  - Range-27: `stash_type` (default 1): float16/bfloat16 ranges are computed in float32
    and cast back; stash_type=0 keeps the input type (the catalogue's Range decides).
  - Cast/CastLike: `saturate` (19) and `round_mode` (24) only concern float8/float8e8m0
    targets, which are refused; the attributes are dropped.
  - BitShift-28 allows signed types (arithmetic right shift; a shift past the width
    gives 0, or -1 shifting a negative right): what the catalogue's numpy reference
    computes; nothing to convert.
New ops read as decompositions (the ONNX function bodies):
  - RMSNormalization-23: Cast(X, stash_type) -> Mul(x, x) -> ReduceMean over
    [axis..rank-1] -> Add epsilon -> Sqrt -> Div(x, .) -> Cast back -> Mul scale.
  - Swish-24: X * Sigmoid(alpha * X).  SwiGLU-28: Swish(A) * B (same shapes).
  - TensorScatter-24 (a KV-cache update, functional): every cache position p along
    `axis` reads update[..., p - w, ...] where 0 <= p - w < L (w = write_indices[b],
    0 when absent; L the update's length; "circular": (p - w) mod max_sequence_length),
    else the past cache: Where(valid, GatherElements(update, Expand(Clip(rel, 0, L-1)),
    axis), past) -- one injective kernel, no data-dependent shape. Linear writes past
    the cache's end are dropped (the spec requires w + L <= max_sequence_length).
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, emit, label, scalar
from hidetc.frontend.onnx.tensors import dtype_name
from hidetc.graph.ir import FLOAT_DTYPES


def _int64(values) -> np.ndarray:
    return np.array(list(values), dtype=np.int64)


def space_to_depth(node: OnnxNode, ctx: Context) -> Converted:
    mode = node.attrs.get("mode", "DCR")
    if mode == "DCR":
        return emit(node.without("mode"), ctx)
    if mode != "CRD":
        raise ModelError(f"{label(node)}: mode '{mode}' is not DCR or CRD")
    x = ctx.types[node.inputs[0]]
    b = int(node.attrs.get("blocksize", 0))
    if x.rank != 4 or b < 1 or x.shape[2] % b or x.shape[3] % b:
        return emit(node, ctx)   # the catalogue's SpaceToDepth reports what is wrong
    n, c, h, w = x.shape
    build = Builder(node, ctx)
    blocks = build.add("Reshape", [node.inputs[0],
                                   build.const("blocks", _int64((n, c, h // b, b, w // b, b)))])
    moved = build.add("Transpose", [blocks], perm=(0, 1, 3, 5, 2, 4))
    build.add("Reshape", [moved, build.const("shape", _int64((n, c * b * b, h // b, w // b)))],
              out=node.outputs[0])
    return build.done()


def mod(node: OnnxNode, ctx: Context) -> Converted:
    dtype = ctx.types[node.inputs[0]].dtype
    if ctx.opset < 28 or node.attrs.get("fmod", 0) or dtype not in FLOAT_DTYPES:
        return emit(node, ctx)
    a, b = node.inputs[:2]
    build = Builder(node, ctx)
    zero = build.const("zero", scalar(0.0, dtype))
    r = build.add("Mod", [a, b], fmod=1)
    signs_differ = build.add("Xor", [build.add("Less", [r, zero]), build.add("Less", [b, zero])])
    is_zero = build.add("Equal", [r, zero])
    adjust = build.add("And", [build.add("Not", [is_zero]), signs_differ])
    shifted = build.add("Where", [adjust, build.add("Add", [r, b]), r])
    signed_zero = build.add("Where", [build.add("Less", [b, zero]),
                                      build.const("negative_zero", scalar(-0.0, dtype)), zero])
    build.add("Where", [is_zero, signed_zero, shifted], out=node.outputs[0])
    return build.done()


def range_(node: OnnxNode, ctx: Context) -> Converted:
    stash = int(node.attrs.get("stash_type", 1))
    dtype = ctx.types[node.inputs[0]].dtype
    plain = node.without("stash_type")
    if ctx.opset < 27 or dtype not in ("float16", "bfloat16") or stash != 1:
        return emit(plain, ctx)
    build = Builder(node, ctx)
    wide = [build.add("Cast", [i], to="float32") for i in node.inputs[:3]]
    values = build.add("Range", wide)
    build.add("Cast", [values], out=node.outputs[0], to=dtype)
    return build.done()


def rms_normalization(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    stash = dtype_name(int(node.attrs.get("stash_type", 1)), f"{label(node)} stash_type")
    axis = int(node.attrs.get("axis", -1))
    if not -x.rank <= axis < x.rank:
        raise ModelError(f"{label(node)}: axis {axis} is out of range for an input of rank "
                         f"{x.rank}")
    axes = _int64(range(axis % x.rank, x.rank))
    build = Builder(node, ctx)
    xu = node.inputs[0] if x.dtype == stash else build.add("Cast", [node.inputs[0]], to=stash)
    mean = build.add("ReduceMean", [build.add("Mul", [xu, xu]), build.const("axes", axes)],
                     keepdims=1)
    eps = build.const("epsilon", scalar(float(node.attrs.get("epsilon", 1e-5)), stash))
    rms = build.add("Sqrt", [build.add("Add", [mean, eps])])
    normalized = build.add("Div", [xu, rms])
    if x.dtype != stash:
        normalized = build.add("Cast", [normalized], to=x.dtype)
    build.add("Mul", [normalized, node.inputs[1]], out=node.outputs[0])
    return build.done()


def _swish(build: Builder, x: str, dtype: str, alpha: float, out: str | None) -> str:
    scaled = x
    if alpha != 1.0:
        scaled = build.add("Mul", [x, build.const("alpha", scalar(alpha, dtype))])
    return build.add("Mul", [x, build.add("Sigmoid", [scaled])], out=out)


def swish(node: OnnxNode, ctx: Context) -> Converted:
    build = Builder(node, ctx)
    _swish(build, node.inputs[0], ctx.types[node.inputs[0]].dtype,
           float(node.attrs.get("alpha", 1.0)), node.outputs[0])
    return build.done()


def swiglu(node: OnnxNode, ctx: Context) -> Converted:
    a, b = (ctx.types[i] for i in node.inputs[:2])
    if a.shape != b.shape:
        raise ModelError(f"{label(node)}: inputs A {list(a.shape)} and B {list(b.shape)} "
                         f"must have the same shape")
    build = Builder(node, ctx)
    gate = _swish(build, node.inputs[0], a.dtype, float(node.attrs.get("alpha", 1.0)), None)
    build.add("Mul", [gate, node.inputs[1]], out=node.outputs[0])
    return build.done()


def tensor_scatter(node: OnnxNode, ctx: Context) -> Converted:
    past, update = (ctx.types[i] for i in node.inputs[:2])
    mode = node.attrs.get("mode", "linear")
    if mode not in ("linear", "circular"):
        raise ModelError(f"{label(node)}: mode '{mode}' is not linear or circular")
    rank = past.rank
    axis = int(node.attrs.get("axis", -2))
    if update.rank != rank or not -rank <= axis < rank or axis % rank == 0:
        raise ModelError(f"{label(node)}: axis {axis} must name a non-batch dimension of "
                         f"past_cache {list(past.shape)} and update {list(update.shape)} "
                         f"(the same rank)")
    axis %= rank
    if update.dtype != past.dtype:
        raise ModelError(f"{label(node)}: update is {update.dtype}, past_cache "
                         f"{past.dtype}: expected the same type")
    length, size = update.shape[axis], past.shape[axis]
    if any(u != p for i, (u, p) in enumerate(zip(update.shape, past.shape)) if i != axis) \
            or length > size:
        raise ModelError(f"{label(node)}: update {list(update.shape)} must match past_cache "
                         f"{list(past.shape)} except along axis {axis}, where it may be "
                         f"no longer")
    build = Builder(node, ctx)
    if length == 0:
        build.add("Identity", [node.inputs[0]], out=node.outputs[0])
        return build.done()
    column = [1] * rank
    column[axis] = size
    rel = build.const("positions", np.arange(size, dtype=np.int64).reshape(column))
    if len(node.inputs) > 2 and node.inputs[2]:
        batch = [past.shape[0]] + [1] * (rank - 1)
        w = build.add("Reshape", [node.inputs[2], build.const("batch_shape", _int64(batch))])
        rel = build.add("Sub", [rel, w])
    if mode == "circular":
        rel = build.add("Mod", [rel, build.const("size", scalar(size, "int64"))])
    zero = build.const("zero", scalar(0, "int64"))
    last = build.const("last", scalar(length - 1, "int64"))
    valid = build.add("And", [build.add("GreaterOrEqual", [rel, zero]),
                              build.add("LessOrEqual", [rel, last])])
    index = build.add("Expand", [build.add("Clip", [rel, zero, last]),
                                 build.const("shape", _int64(past.shape))])
    taken = build.add("GatherElements", [node.inputs[1], index], axis=axis)
    build.add("Where", [valid, taken, node.inputs[0]], out=node.outputs[0])
    return build.done()


HANDLERS = {
    "SpaceToDepth": space_to_depth,
    "Mod": mod,
    "Range": range_,
    "RMSNormalization": rms_normalization,
    "Swish": swish,
    "SwiGLU": swiglu,
    "TensorScatter": tensor_scatter,
}
EXTRA_OPS = ("RMSNormalization", "Swish", "SwiGLU", "TensorScatter")
CHECKED: tuple[str, ...] = ("TensorScatter",)   # one schema version (24) up to opset 28
FIRST_VERSION: dict[str, int] = {}
