"""Compute definitions of per-channel and windowed ops (`NN[op](task, idx, load)`, merged
into `hidetc.compute.injective.COMPUTE`):

- PRelu: `x < 0 ? x * slope : x`, slope broadcast unidirectionally to x.
- BatchNormalization (inference; training_mode is rejected by the op's shape rule):
  `(x - mean) / sqrt(var + epsilon) * scale + bias` with the parameters at the
  element's channel (dim 1), converted to x's (arithmetic) dtype. The arithmetic runs
  in x's dtype (float32 for float16 storage on CUDA); the numpy reference in float64,
  so results agree to a few float32 ulps.
- LRN: `x / (bias + alpha / size * sum(x[c']^2))^beta` over the channels
  c' in [c - floor((size-1)/2), c + ceil((size-1)/2)] clipped to [0, C), as ONNX
  defines it; out-of-range neighbours are neither read nor summed.
- Trilu: x where `j - i >= k` (upper, the default) or `j - i <= k` (lower), else 0, for
  the last two dims (i, j); k is read from input 1 at run time (default 0), compared
  in int64, so any k works (|k| beyond the matrix keeps or zeroes everything).
"""
from __future__ import annotations

from hidetc.compute.indexing import Compute, Load, load_broadcast, load_scalar, present
from hidetc.compute.task import Task
from hidetc.tir.ir import Const, Expr, as_expr, call, cast, logical_and, select


def _prelu(task: Task, idx: list[Expr], load: Load) -> Expr:
    x = load(0, idx)
    slope = cast(load_broadcast(task, 1, idx, load), x.dtype)
    return select(x < as_expr(0, x), x * slope, x)


def _batchnorm(task: Task, idx: list[Expr], load: Load) -> Expr:
    x = load(0, idx)
    c = [idx[1]]
    scale, bias, mean, var = (cast(load(i, c), x.dtype) for i in (1, 2, 3, 4))
    eps = as_expr(float(task.attr("epsilon", 1e-5)), x)
    return (x - mean) / call("sqrt", var + eps) * scale + bias


def _lrn(task: Task, idx: list[Expr], load: Load) -> Expr:
    size = int(task.attr("size"))
    channels = task.inputs[0].shape[1]
    x = load(0, idx)
    total: Expr | None = None
    for d in range(-((size - 1) // 2), (size - 1) - (size - 1) // 2 + 1):
        ch = idx[1] + d if d else idx[1]
        valid = logical_and(ch >= 0, ch < channels)
        src = list(idx)
        src[1] = select(valid, ch, Const(0, "int32")) if d else ch
        v = load(0, src)
        term = select(valid, v * v, as_expr(0.0, v)) if d else v * v
        total = term if total is None else total + term
    alpha = as_expr(float(task.attr("alpha", 1e-4)) / size, x)
    base = as_expr(float(task.attr("bias", 1.0)), x) + alpha * total
    return x / call("pow", base, as_expr(float(task.attr("beta", 0.75)), x))


def _trilu(task: Task, idx: list[Expr], load: Load) -> Expr:
    x = load(0, idx)
    k = cast(load_scalar(task, 1, load), "int64") if present(task, 1) else Const(0, "int64")
    diagonal = cast(idx[-1], "int64") - cast(idx[-2], "int64")
    keep = diagonal >= k if task.attr("upper", 1) else diagonal <= k
    return select(keep, x, cast(as_expr(0), x.dtype))


NN: dict[str, Compute] = {
    "PRelu": _prelu,
    "BatchNormalization": _batchnorm,
    "LRN": _lrn,
    "Trilu": _trilu,
}
