"""CPU rules for reductions: Reduce* over any axes, Softmax/LogSoftmax along one axis,
LayerNormalization over the trailing axes.

Rows of independent work run in parallel; each row reduces in float32 (f32 inputs),
Softmax and LayerNormalization rows in LANES interleaved partial results so the loops
vectorize (`lane_reduce`). Softmax subtracts the row maximum; LayerNormalization uses
two passes (mean, then the mean of squared deviations) rather than E[x^2] - E[x]^2.
The Reduce* tables (identity, combine, finalize, accumulation dtypes) are
target-neutral, in `hidetc.schedules.common.reducers`, shared with the CUDA template.
"""
from __future__ import annotations

import math
from typing import Callable

from hidetc.compute.injective import broadcast_index, unravel
from hidetc.compute.task import Task
from hidetc.graph.symbolic import SymDim
from hidetc.schedules.common.reducers import (
    HALF_ACC,
    INF,
    REDUCERS,
    identity_const,
    reduced_axes,
)
from hidetc.schedules.cpu import avx2
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    FLOATS,
    Buffer,
    Const,
    Expr,
    Function,
    Var,
    as_expr,
    call,
    cast,
    logical_and,
    maximum,
    ne,
    select,
)
from hidetc.tir.mapping import repeat, spatial


def build_reduce(task: Task, name: str) -> Function:
    if task.op == "ReduceLogSumExp" and task.outputs[0].dtype in FLOATS:
        return _build_logsumexp(task, name)
    init, combine, finalize = REDUCERS[task.op]
    x_type, out_type = task.inputs[0], task.outputs[0]
    shape = x_type.shape
    axes = reduced_axes(task)
    kept = [1 if d in axes else n for d, n in enumerate(shape)]
    reduced = [shape[d] for d in axes] or [1]
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", x_type.dtype, shape)
    out = kb.buffer("out", out_type.dtype, (math.prod(kept),))
    with kb.for_range(math.prod(kept), kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(*kept), p) as oidx:
            acc_dt = HALF_ACC.get(out_type.dtype, out_type.dtype)
            def value(ridx):
                idx = list(oidx)
                for d, r in zip(axes, ridx):
                    idx[d] = r
                return cast(x[tuple(idx)], acc_dt)
            if task.op in ORDER_FREE and axes and axes[-1] == len(shape) - 1 and \
                    isinstance(shape[-1], int) and shape[-1] >= 2 * LANES:
                acc = _lane_fold(kb, reduced, acc_dt, identity_const(init, acc_dt),
                                 combine, value, task.op)
            else:
                acc = kb.declare("acc", acc_dt, identity_const(init, acc_dt))
                _over(kb, reduced, lambda ridx: kb.assign(acc, combine(acc, value(ridx))))
            kb.store(out, (p,), cast(finalize(acc, math.prod(reduced)), out_type.dtype))
    return kb.finish()


# reductions whose result does not depend on the order of the combines (exact)
ORDER_FREE = ("ReduceMax", "ReduceMin")


def _lane_fold(kb: KernelBuilder, reduced: list[int], dtype: str, init: Const, combine,
               value, op: str) -> Var:
    """An ORDER_FREE reduction whose last reduced dim is the tensor's last (contiguous)
    one: along it, float32 in AVX2 lanes (`_mm256_max_ps` / `_mm256_min_ps`, a NaN found
    by an unordered compare beside them: those instructions drop a NaN of their first
    operand), other types in LANES scalar partial results; over the other reduced dims
    serially, then the lanes combined. (gcc keeps the NaN-aware scalar max serial: a
    whole-tensor max was a visible share of BERT's dynamic quantization.)"""
    *outer, last = reduced
    vector = dtype == "float32"
    tail = kb.declare("tail", dtype, init)
    if vector:
        vacc = kb.declare("vacc", YMM, avx2.vcall("_mm256_set1_ps", init, dtype=YMM))
        vnan = kb.declare("vnan", YMM, avx2.vcall("_mm256_setzero_ps", dtype=YMM))
    else:
        part = kb.alloc("part", dtype, (LANES,))
        with kb.for_range(LANES, name="l") as lane:
            kb.store(part, (lane,), init)

    def row(ridx):
        ridx = tuple(ridx)
        with kb.for_range(last // LANES, name="kk") as kk:
            if vector:
                first = value(ridx + (kk * LANES,))
                v = kb.declare("v", YMM, avx2.vcall("_mm256_loadu_ps", first, dtype=YMM))
                name = "_mm256_max_ps" if op == "ReduceMax" else "_mm256_min_ps"
                kb.assign(vacc, avx2.vcall(name, v, vacc, dtype=YMM))
                unordered = avx2.vcall("_mm256_cmp_ps", v, v, Const(3, "int32"), dtype=YMM)
                kb.assign(vnan, avx2.vcall("_mm256_or_ps", vnan, unordered, dtype=YMM))
            else:
                with kb.for_range(LANES, name="l") as lane:
                    kb.store(part, (lane,), combine(part[lane],
                                                    value(ridx + (kk * LANES + lane,))))
        with kb.for_range(last % LANES, name="t") as t:
            kb.assign(tail, combine(tail, value(ridx + (last // LANES * LANES + t,))))
    if outer:
        _over(kb, outer, row)
    else:
        row(())
    acc = kb.declare("acc", dtype, tail)
    if vector:
        part = kb.alloc("part", dtype, (LANES,))
        kb.evaluate(avx2.vcall("_mm256_storeu_ps", part[0], vacc, dtype="void"))
    for lane in range(LANES):
        kb.assign(acc, combine(acc, part[lane]))
    if vector:
        found = avx2.vcall("_mm256_movemask_ps", vnan, dtype="int32")
        kb.assign(acc, select(ne(found, 0), Const(float("nan"), "float32"), acc))
    return acc


def _over(kb: KernelBuilder, reduced: list[int], body) -> None:
    """`body(ridx)` for every index of the reduced dims; nothing when one is empty (the
    reduction of an empty set is its identity, finalized)."""
    if 0 in reduced:
        return
    with kb.for_mapping(repeat(*reduced), 0) as ridx:
        body(ridx)


def _build_logsumexp(task: Task, name: str) -> Function:
    """log(sum(exp(x - m))) + m with m the maximum (0 when not finite, as numpy's
    reference does), so large inputs do not overflow."""
    x_type, out_type = task.inputs[0], task.outputs[0]
    shape, dt = x_type.shape, out_type.dtype
    axes = reduced_axes(task)
    kept = [1 if d in axes else n for d, n in enumerate(shape)]
    reduced = [shape[d] for d in axes] or [1]
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", x_type.dtype, shape)
    out = kb.buffer("out", dt, (math.prod(kept),))

    def element(oidx, ridx) -> Expr:
        idx = list(oidx)
        for d, r in zip(axes, ridx):
            idx[d] = r
        return cast(x[tuple(idx)], dt)

    with kb.for_range(math.prod(kept), kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(*kept), p) as oidx:
            top = kb.declare("top", dt, -INF)
            _over(kb, reduced, lambda ridx: kb.assign(top, maximum(top, element(oidx, ridx))))
            finite = logical_and(top > -INF, top < INF)
            kb.assign(top, select(finite, top, Const(0.0, dt)))
            acc = kb.declare("acc", dt, 0.0)
            _over(kb, reduced, lambda ridx: kb.assign(
                acc, acc + call("exp", element(oidx, ridx) - top)))
            kb.store(out, (p,), call("log", acc) + top)
    return kb.finish()


def _axis_view(shape: tuple[int, ...], axis: int) -> tuple[int, int, int]:
    axis %= len(shape)
    return math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


SOFTMAX_SCRATCH = 4096   # row elements kept in a per-thread stack buffer (16 KiB of f32)


def build_softmax(task: Task, name: str) -> Function:
    """Per row of at most SOFTMAX_SCRATCH elements: the row copied once into a local
    buffer (a fused prologue is computed once per element, not once per pass), its
    maximum (`_row_max`), then e = exp(x - max) in place and summed in lanes, then each
    output stored once: e / total, or x - max - log(total) for LogSoftmax. Longer rows
    read x in each pass. The output is written once per element and never read back,
    so epilogues can be grafted onto its store. A NaN in a row makes the whole row NaN
    (through exp and the sum, whatever maximum is taken)."""
    x_type = task.inputs[0]
    outer, n, inner = _axis_view(x_type.shape, task.attr("axis", -1))
    dt = x_type.dtype
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (outer, n, inner))
    out = kb.buffer("out", dt, (outer, n, inner))
    acc_dt = HALF_ACC.get(dt, dt)
    soft = task.op == "Softmax"
    keep = n <= SOFTMAX_SCRATCH
    with kb.for_range(outer * inner, kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(outer, inner), p, names=["o", "i"]) as (o, i):
            if keep:
                row = kb.alloc("row", dt, (n,))
                with kb.for_range(n, name="k") as k:
                    kb.store(row, (k,), x[o, k, i])
                top = _row_max(kb, n, row)
                value = lambda k: row[k]                       # noqa: E731
            else:
                value = lambda k: x[o, k, i]                   # noqa: E731
                top = lane_reduce(kb, n, dt, -INF, maximum, value, "top")
            if soft and keep:   # e = exp(x - max) in place, read back by the sum and store
                with kb.for_range(n, name="k") as k:
                    kb.store(row, (k,), call("exp", row[k] - top))
                e = value
            else:
                e = lambda k: call("exp", value(k) - top)     # noqa: E731
            total = cast(lane_reduce(kb, n, acc_dt, 0.0, lambda a, v: a + v,
                                     lambda k: cast(e(k), acc_dt), "total"), dt)
            with kb.for_range(n, name="k") as k:
                if soft:
                    kb.store(out, (o, k, i), e(k) / total)
                else:
                    kb.store(out, (o, k, i), value(k) - top - call("log", total))
    return kb.finish()


def _row_max(kb: KernelBuilder, n: int, row: Buffer) -> Var:
    """The maximum of a local row buffer; float32 rows of 16+ elements in AVX2 lanes
    (`_mm256_max_ps` keeps a NaN only when it is the second operand: callers must let a
    NaN reach the result some other way, as softmax's exp and sum do)."""
    if row.dtype != "float32" or n < 2 * LANES:
        return lane_reduce(kb, n, row.dtype, -INF, maximum, lambda k: row[k], "top")
    vmax = kb.declare("vmax", YMM, avx2.vcall("_mm256_set1_ps", Const(-INF, "float32"),
                                              dtype=YMM))
    with kb.for_range(n // LANES, name="kk") as kk:
        kb.assign(vmax, avx2.vcall("_mm256_max_ps", vmax,
                                   avx2.vcall("_mm256_loadu_ps", row[kk * LANES], dtype=YMM),
                                   dtype=YMM))
    lanes = kb.alloc("top_lanes", "float32", (LANES,))
    kb.evaluate(avx2.vcall("_mm256_storeu_ps", lanes[0], vmax, dtype="void"))
    top = kb.declare("top", "float32", lanes[0])
    for lane in range(1, LANES):
        kb.assign(top, maximum(top, lanes[lane]))
    if isinstance(n, SymDim):            # the tail as a loop of run-time extent
        with kb.for_range(n % LANES, name="t") as t:
            kb.assign(top, maximum(top, row[n // LANES * LANES + t]))
        return top
    for t in range(n // LANES * LANES, n):
        kb.assign(top, maximum(top, row[t]))
    return top


LANES = 8            # partial results of a row reduction (one ymm of f32, AVX2 on
YMM = "float32x8"    # every ISA: the same lanes, so the same sums, on AVX-512 hosts)


def lane_reduce(kb: KernelBuilder, n: int, dtype: str, init: float, combine,
                term: Callable[[Expr], Expr], name: str) -> Var:
    """combine(... combine(init, term(0)) ..., term(n-1)) as LANES interleaved partial
    results (element k goes to lane k % LANES), combined in lane order at the end: the
    loop vectorizes, where gcc keeps a serial float reduction scalar (without
    -ffast-math it may not reorder it). Rows shorter than 2 * LANES reduce serially."""
    if n < 2 * LANES:
        acc = kb.declare(name, dtype, init)
        with kb.for_range(n, name="k") as k:
            kb.assign(acc, combine(acc, term(k)))
        return acc
    part = kb.alloc(f"{name}_lanes", dtype, (LANES,))
    with kb.for_range(LANES, name="l") as lane:
        kb.store(part, (lane,), Const(init, dtype))
    with kb.for_range(n // LANES, name="kk") as kk, kb.for_range(LANES, name="l") as lane:
        kb.store(part, (lane,), combine(part[lane], term(kk * LANES + lane)))
    if isinstance(n, SymDim) or n % LANES:     # (symbolic: a tail of 0 to 7 at run time)
        with kb.for_range(n % LANES, name="t") as t:
            kb.store(part, (t,), combine(part[t], term(n // LANES * LANES + t)))
    acc = kb.declare(name, dtype, part[0])
    for lane in range(1, LANES):
        kb.assign(acc, combine(acc, part[lane]))
    return acc


def layernorm_buffers(kb: KernelBuilder, task: Task):
    """LayerNormalization viewed as rows x n (n = the normalized trailing dims):
    (rows, n, epsilon, (x, scale, bias or None, out)) with the kernel's buffers declared;
    scale and bias are functions k -> element (they may broadcast over the normalized
    dims, as ONNX allows)."""
    x_type = task.inputs[0]
    axis = task.attr("axis", -1) % len(x_type.shape)
    norm_shape = tuple(x_type.shape[axis:])
    rows, n = math.prod(x_type.shape[:axis]), math.prod(norm_shape)
    dt = x_type.dtype
    x = kb.buffer("x", dt, (rows, n))

    def param(i: int, label: str):
        shape = tuple(task.inputs[i].shape)
        if math.prod(shape) == n:
            flat = kb.buffer(label, task.inputs[i].dtype, (n,))
            return lambda k: flat[k]
        buf = kb.buffer(label, task.inputs[i].dtype, shape)
        return lambda k: buf[tuple(broadcast_index(unravel(k, norm_shape), shape))]

    scale = param(1, "scale")
    bias = param(2, "bias") if 2 in task.buffer_inputs else None
    out = kb.buffer("out", dt, (rows, n))
    return rows, n, float(task.attr("epsilon", 1e-5)), (x, scale, bias, out)


def build_layernorm(task: Task, name: str) -> Function:
    """Per row, shifted two-pass statistics: with s = x[r, 0], d = mean(x - s) and
    var = mean(((x - s) - d)^2), so a large mean costs no precision (E[x^2] - E[x]^2
    and even a plain two-pass with the mean rounded lose digits when |mean| >> std);
    y = ((x - s) - d) * rsqrt(var + eps) * scale + bias."""
    kb = KernelBuilder(name, "cpu")
    rows, n, eps, (x, scale, bias, out) = layernorm_buffers(kb, task)
    dt = x.dtype
    with kb.for_range(rows, kind="parallel", name="r") as r:
        shift = kb.declare("shift", dt, x[r, 0])
        mean = _row_sum(kb, n, lambda k: x[r, k] - shift, dt, "mean")
        kb.assign(mean, mean / float(n))
        var = _row_sum(kb, n, lambda k: (x[r, k] - shift - mean) * (x[r, k] - shift - mean),
                       dt, "var")
        inv = kb.declare("inv", dt, as_expr(1.0, mean) / call("sqrt", var / float(n) + eps))
        with kb.for_range(n, name="k") as k:
            y: Expr = (x[r, k] - shift - mean) * inv * scale(k)
            kb.store(out, (r, k), y + bias(k) if bias is not None else y)
    return kb.finish()


def _row_sum(kb: KernelBuilder, n: int, term, dtype: str, name: str):
    return lane_reduce(kb, n, dtype, 0.0, lambda a, v: a + v, term, name)
