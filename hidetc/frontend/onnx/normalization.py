"""LayerNormalization when its optional outputs are read, and LpNormalization, as
decompositions into catalogue ops.

Assumes: static shapes. Schema history (reviewed up to opset 28): LayerNormalization
has one version (17); LpNormalization-1 and -22 differ only in their type lists
(bfloat16 added).
Guarantees:
  - LayerNormalization whose Mean and InvStdDev nobody reads (the common case: BERT,
    GPT-2) stays the one fused catalogue node, exactly as the default path emits it
    (the importer drops the unread optional outputs). When Mean or InvStdDev is read
    (by a node or as a graph output) the node is read as its function body, with the
    variance taken as the mean of squared deviations:
      xu = Cast(X, stash_type) (when X is not already that type); axes = [axis..rank-1]
      Mean = ReduceMean(xu, axes, keepdims=1); D = xu - Mean
      InvStdDev = Reciprocal(Sqrt(ReduceMean(D * D, axes, keepdims=1) + epsilon))
      Y = Cast(D * InvStdDev, X's type) * Scale (+ B)
    Mean and InvStdDev have X's shape with the normalized dims set to 1, in stash_type.
  - LpNormalization: y = x / ReduceL{p}(x, [axis], keepdims=1), and 0 where that norm
    is 0 (as the ONNX spec says); p must be 1 or 2.
Bad attributes or shapes are one-line ModelErrors naming the node.
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ModelError, UnsupportedOpError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, emit, label, scalar
from hidetc.frontend.onnx.tensors import dtype_name
from hidetc.graph.ir import FLOAT_DTYPES, TensorType

LP_REDUCERS = {1: "ReduceL1", 2: "ReduceL2"}


def _axis(node: OnnxNode, rank: int, default: int) -> int:
    axis = int(node.attrs.get("axis", default))
    if not -rank <= axis < rank:
        raise ModelError(f"{label(node)}: axis {axis} is out of range for an input of rank "
                         f"{rank}")
    return axis % rank


def _float_tensor(node: OnnxNode, x: TensorType) -> None:
    if x.dtype not in FLOAT_DTYPES:
        raise ModelError(f"{label(node)}: input 0 has dtype {x.dtype}, expected a float type")
    if x.rank == 0:
        raise ModelError(f"{label(node)}: input 0 is a scalar, expected rank >= 1")


def _broadcastable(node: OnnxNode, ctx: Context, index: int, target: tuple[int, ...]) -> None:
    """Input `index` must broadcast (numpy rules, one way) to `target`."""
    shape = ctx.types[node.inputs[index]].shape
    fits = len(shape) <= len(target) and all(
        s in (1, t) for s, t in zip(shape[::-1], target[::-1]))
    if not fits:
        raise ModelError(f"{label(node)}: input {index} has shape {list(shape)}, expected one "
                         f"that broadcasts to the normalized shape {list(target)}")


def _stats_read(node: OnnxNode, ctx: Context) -> bool:
    return any(o and o in ctx.used for o in node.outputs[1:3])


def _mixed_types(node: OnnxNode, ctx: Context) -> bool:
    """Scale or B of another float type than X: ONNX Runtime's own LayerNormalization of
    the default domain before opset 17 (X of type T, Scale, B and Y of type V)."""
    x = ctx.types[node.inputs[0]].dtype
    return any(node.input(i) and ctx.types[node.inputs[i]].dtype != x for i in (1, 2))


def _layer_norm_mixed(node: OnnxNode, ctx: Context) -> Converted:
    """ONNX Runtime's form (`_mixed_types`), as its kernel computes it: in float32, the
    result cast to Scale's type."""
    x = ctx.types[node.inputs[0]]
    _float_tensor(node, x)
    if _stats_read(node, ctx):
        raise UnsupportedOpError(f"{label(node)}: Scale/B of type "
                                 f"{ctx.types[node.inputs[1]].dtype} beside X of type "
                                 f"{x.dtype} with Mean or InvStdDev read is not supported")
    build = Builder(node, ctx)
    wide = [v if ctx.types[v].dtype == "float32" else build.add("Cast", [v], to="float32")
            for v in node.inputs[:3] if v]
    out = ctx.types[node.inputs[1]].dtype
    y = build.add("LayerNormalization", wide, out=node.outputs[0] if out == "float32" else None,
                  axis=int(node.attrs.get("axis", -1)),
                  epsilon=float(node.attrs.get("epsilon", 1e-5)))
    if out != "float32":
        build.add("Cast", [y], out=node.outputs[0], to=out)
    return build.done()


def layer_normalization(node: OnnxNode, ctx: Context) -> Converted:
    if _mixed_types(node, ctx):
        return _layer_norm_mixed(node, ctx)
    if not _stats_read(node, ctx):
        return emit(node, ctx)      # the fused node (what the default path emits)
    x = ctx.types[node.inputs[0]]
    _float_tensor(node, x)
    axis = _axis(node, x.rank, -1)
    for index in (1, 2):
        if node.input(index):
            _broadcastable(node, ctx, index, x.shape[axis:])
    stash = dtype_name(int(node.attrs.get("stash_type", 1)), f"{label(node)} stash_type")
    outputs = list(node.outputs) + [""] * (3 - len(node.outputs))
    build = Builder(node, ctx)
    axes = build.const("axes", np.arange(axis, x.rank, dtype=np.int64))
    xu = node.inputs[0] if x.dtype == stash else build.add("Cast", [node.inputs[0]], to=stash)
    mean = build.add("ReduceMean", [xu, axes], out=outputs[1] or None, keepdims=1)
    deviation = build.add("Sub", [xu, mean])
    var = build.add("ReduceMean", [build.add("Mul", [deviation, deviation]), axes], keepdims=1)
    eps = build.const("epsilon", scalar(float(node.attrs.get("epsilon", 1e-5)), stash))
    std = build.add("Sqrt", [build.add("Add", [var, eps])])
    inv = build.add("Reciprocal", [std], out=outputs[2] or None)
    normalized = build.add("Mul", [deviation, inv])
    if x.dtype != stash:
        normalized = build.add("Cast", [normalized], to=x.dtype)
    biased = bool(node.input(2))
    scaled = build.add("Mul", [normalized, node.inputs[1]],
                       out=None if biased else outputs[0])
    if biased:
        build.add("Add", [scaled, node.inputs[2]], out=outputs[0])
    return build.done()


def lp_normalization(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    p = int(node.attrs.get("p", 2))
    if p not in LP_REDUCERS:
        raise ModelError(f"{label(node)}: p={p} is not supported (ONNX allows 1 or 2)")
    _float_tensor(node, x)
    axis = _axis(node, x.rank, -1)
    build = Builder(node, ctx)
    axes = build.const("axes", np.array([axis], dtype=np.int64))
    norm = build.add(LP_REDUCERS[p], [node.inputs[0], axes], keepdims=1)
    zero = build.const("zero", scalar(0, x.dtype))
    scaled = build.add("Div", [node.inputs[0], norm])
    build.add("Where", [build.add("Equal", [norm, zero]), zero, scaled], out=node.outputs[0])
    return build.done()


HANDLERS = {
    "LayerNormalization": layer_normalization,
    "LpNormalization": lp_normalization,
}
EXTRA_OPS: tuple[str, ...] = ("LpNormalization",)
CHECKED: tuple[str, ...] = ("LayerNormalization", "LpNormalization")
FIRST_VERSION: dict[str, int] = {}
