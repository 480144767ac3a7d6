"""Det (opsets 11, 22) read as Gaussian elimination with partial pivoting, unrolled over
the (static) matrix size into catalogue ops on the whole batch at once.

For X [*, n, n], S_0 = X; step k (n - 1 steps) on S_k [*, m, m], m = n - k:
  - p = ArgMax(|S_k[..., :, 0]|) (the pivot row, per matrix), rows 0 and p swapped
    (GatherElements along the rows with index Where(r == 0, p, Where(r == p, 0, r)));
    a swap (p != 0) flips the sign;
  - d_k = the pivot T[..., 0, 0]; S_{k+1} = T[..., 1:, 1:] - (T[..., 1:, :1] / d_k) *
    T[..., :1, 1:] (a zero pivot means the column is zero below it too: the factors are
    taken as 0 and d_k = 0 makes the determinant 0, as LAPACK's does);
then det = sign * d_0 * ... * d_{n-2} * S_{n-1}, reshaped to [*]. float16/bfloat16
inputs are eliminated in float32 and the result rounded once; float32 and float64 in
their own type (numpy's det works in the input's precision too). A 0 x 0 matrix has
determinant 1. The graph grows ~15 nodes per step: meant for the small matrices Det is
used on (transforms, covariance), not for n in the hundreds.
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, label, scalar

WORK_DTYPE = {"float16": "float32", "bfloat16": "float32"}


def _slice(build: Builder, x: str, rows: tuple[int, int], cols: tuple[int, int]) -> str:
    starts, ends = (np.array(v, np.int64) for v in ((rows[0], cols[0]), (rows[1], cols[1])))
    return build.add("Slice", [x, build.const("starts", starts), build.const("ends", ends),
                               build.const("axes", np.array([-2, -1], np.int64))])


def det(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    if x.rank < 2 or x.shape[-1] != x.shape[-2]:
        raise ModelError(f"{label(node)}: input X has shape {list(x.shape)}, expected "
                         f"[*, M, M] (square matrices)")
    if x.dtype not in ("float16", "bfloat16", "float32", "float64"):
        raise ModelError(f"{label(node)}: input X is {x.dtype}, expected a float type")
    batch, n = tuple(x.shape[:-2]), x.shape[-1]
    build = Builder(node, ctx)
    work = WORK_DTYPE.get(x.dtype, x.dtype)
    if n == 0:
        return Converted((), {node.outputs[0]: np.ones(batch, np.dtype(x.dtype))})
    s = node.inputs[0]
    if work != x.dtype:
        s = build.add("Cast", [s], to=work)
    zero_i, zero_f = build.const("zero", scalar(0, "int64")), build.const("0", scalar(0, work))
    one_f, minus_one = build.const("1", scalar(1, work)), build.const("-1", scalar(-1, work))
    factors: list[str] = []
    for m in range(n, 1, -1):
        column = _slice(build, s, (0, m), (0, 1))
        p = build.add("ArgMax", [build.add("Abs", [column])], axis=-2, keepdims=1)
        rows = build.const("rows", np.arange(m, dtype=np.int64).reshape(m, 1))
        index = build.add("Where", [build.add("Equal", [rows, zero_i]), p,
                                    build.add("Where", [build.add("Equal", [rows, p]),
                                                        zero_i, rows])])
        index = build.add("Expand", [index, build.const("shape", np.array(
            batch + (m, m), np.int64))])
        t = build.add("GatherElements", [s, index], axis=-2)
        factors.append(build.add("Where", [build.add("Equal", [p, zero_i]), one_f,
                                           minus_one]))
        pivot = _slice(build, t, (0, 1), (0, 1))
        factors.append(pivot)
        safe = build.add("Where", [build.add("Equal", [pivot, zero_f]), one_f, pivot])
        scale = build.add("Div", [_slice(build, t, (1, m), (0, 1)), safe])
        update = build.add("Mul", [scale, _slice(build, t, (0, 1), (1, m))])
        s = build.add("Sub", [_slice(build, t, (1, m), (1, m)), update])
    total = s
    for f in factors:
        total = build.add("Mul", [total, f])
    if work != x.dtype:
        total = build.add("Cast", [total], to=x.dtype)
    build.add("Reshape", [total, build.const("out_shape", np.array(batch, np.int64))],
              out=node.outputs[0])
    return build.done()


HANDLERS = {"Det": det}
EXTRA_OPS = ("Det",)
CHECKED: tuple[str, ...] = ("Det",)   # Det-11; Det-22 only adds bfloat16
FIRST_VERSION: dict[str, int] = {"Det": 11}
