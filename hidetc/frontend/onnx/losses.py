"""NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss, read as decompositions into
catalogue ops (the ONNX function bodies, with the same gather-then-weight structure).

Assumes: static shapes; input [N, C, d1..dk] (k >= 0), target [N, d1..dk] of int32 or
int64, optional weight [C]. Schema history (reviewed up to opset 28): NLL-12/13/22 and
SCE-12/13 differ only in their type lists (bfloat16 added), so every version is read
the same way.
Guarantees, with t the target and m = (t == ignore_index) when ignore_index is given:
  - t' = Where(m, 0, t): a target equal to ignore_index (even one outside [0, C)) is
    clamped to class 0 before any gather, and its loss and weight are then zeroed;
  - g = -GatherElements(input, Unsqueeze(t', 1), axis=1) squeezed to [N, d1..dk] (0
    where m);
    w = Gather(weight, t') (or 1), zeroed where m; loss = g * w;
  - reduction "none": loss; "sum": ReduceSum(loss); "mean": ReduceSum(loss) /
    ReduceSum(w) when a weight or ignore_index is given (a weighted mean over the
    samples not ignored; all ignored gives 0/0 = NaN, as the function body), else
    ReduceMean(loss). Scalar results have shape [].
  - SoftmaxCrossEntropyLoss: log_prob = LogSoftmax(scores, axis=1) (written to the
    optional second output when the node has one), then the NLL above on log_prob.
Targets outside [0, C) that are not ignore_index are undefined by ONNX (not checked).
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, label, scalar
from hidetc.graph.ir import FLOAT_DTYPES

REDUCTIONS = ("none", "sum", "mean")
INDEX_DTYPES = ("int32", "int64")
AXIS_1 = np.array([1], dtype=np.int64)


def _check(node: OnnxNode, ctx: Context, names: tuple[str, str, str]) -> str:
    """Validate inputs and attributes; returns the reduction."""
    x, target = (ctx.types[i] for i in node.inputs[:2])
    reduction = node.attrs.get("reduction", "mean")
    if isinstance(reduction, bytes):
        reduction = reduction.decode()
    if reduction not in REDUCTIONS:
        raise ModelError(f"{label(node)}: reduction '{reduction}' is not one of "
                         f"{', '.join(REDUCTIONS)}")
    if x.dtype not in FLOAT_DTYPES:
        raise ModelError(f"{label(node)}: input 0 ({names[0]}) has dtype {x.dtype}, expected "
                         f"a float type")
    if x.rank < 2:
        raise ModelError(f"{label(node)}: input 0 ({names[0]}) has shape {list(x.shape)}, "
                         f"expected rank >= 2 [N, C, d1..dk]")
    if target.dtype not in INDEX_DTYPES:
        raise ModelError(f"{label(node)}: input 1 ({names[1]}) has dtype {target.dtype}, "
                         f"expected int32 or int64")
    expected = (x.shape[0],) + x.shape[2:]
    if target.shape != expected:
        raise ModelError(f"{label(node)}: input 1 ({names[1]}) has shape "
                         f"{list(target.shape)}, expected {list(expected)}")
    if node.input(2):
        weight = ctx.types[node.inputs[2]]
        if weight.shape != (x.shape[1],) or weight.dtype != x.dtype:
            raise ModelError(f"{label(node)}: input 2 ({names[2]}) is {weight.dtype}"
                             f"{list(weight.shape)}, expected {x.dtype}[{x.shape[1]}]")
    return reduction


def _nll(build: Builder, node: OnnxNode, log_prob: str, reduction: str, out: str) -> str:
    """The NLL loss of `log_prob` (the node's input 0 or a LogSoftmax of it) against the
    node's target and optional weight, written to `out`."""
    ctx = build.ctx
    dtype = ctx.types[node.inputs[0]].dtype
    target = node.inputs[1]
    tdtype = ctx.types[target].dtype
    mask, safe, zero = None, target, None
    if "ignore_index" in node.attrs:
        zero = build.const("zero", scalar(0, dtype))
        ignore = build.const("ignore_index", scalar(int(node.attrs["ignore_index"]), tdtype))
        mask = build.add("Equal", [target, ignore])
        safe = build.add("Where", [mask, build.const("class_0", scalar(0, tdtype)), target])
    weight = None
    if node.input(2):
        weight = build.add("Gather", [node.inputs[2], safe], axis=0)
        if mask is not None:
            weight = build.add("Where", [mask, zero, weight])
    elif mask is not None:
        weight = build.add("Where", [mask, zero, build.const("one", scalar(1, dtype))])
    axis = build.const("axis_1", AXIS_1)
    picked = build.add("GatherElements", [log_prob, build.add("Unsqueeze", [safe, axis])],
                       axis=1)
    picked = build.add("Squeeze", [picked, axis])
    if mask is not None:   # as the function body: no inf * 0 at an ignored sample
        picked = build.add("Where", [mask, zero, picked])
    last = out if reduction == "none" else None
    loss = build.add("Neg", [picked], out=last if weight is None else None)
    if weight is not None:
        loss = build.add("Mul", [loss, weight], out=last)
    if reduction == "none":
        return loss
    if reduction == "sum":
        return build.add("ReduceSum", [loss], out=out, keepdims=0)
    if weight is None:
        return build.add("ReduceMean", [loss], out=out, keepdims=0)
    total = build.add("ReduceSum", [loss], keepdims=0)
    return build.add("Div", [total, build.add("ReduceSum", [weight], keepdims=0)], out=out)


def negative_log_likelihood_loss(node: OnnxNode, ctx: Context) -> Converted:
    reduction = _check(node, ctx, ("input", "target", "weight"))
    build = Builder(node, ctx)
    _nll(build, node, node.inputs[0], reduction, node.outputs[0])
    return build.done()


def softmax_cross_entropy_loss(node: OnnxNode, ctx: Context) -> Converted:
    reduction = _check(node, ctx, ("scores", "labels", "weights"))
    build = Builder(node, ctx)
    named = len(node.outputs) > 1 and node.outputs[1]
    log_prob = build.add("LogSoftmax", [node.inputs[0]], axis=1,
                         out=node.outputs[1] if named else None)
    _nll(build, node, log_prob, reduction, node.outputs[0])
    return build.done()


HANDLERS = {
    "NegativeLogLikelihoodLoss": negative_log_likelihood_loss,
    "SoftmaxCrossEntropyLoss": softmax_cross_entropy_loss,
}
EXTRA_OPS: tuple[str, ...] = tuple(HANDLERS)
CHECKED: tuple[str, ...] = tuple(HANDLERS)
FIRST_VERSION: dict[str, int] = {}  # born at opset 12: every version is read
