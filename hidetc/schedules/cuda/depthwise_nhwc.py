"""CUDA rule: depthwise 2-D convolution in NHWC (`ConvNHWC` with one input and one output
channel per group, group = C > 1), the channels-last layout `choose_layout` gives
MobileNet-V2's blocks on cuda f16 and bf16, so they run NHWC from pointwise to pointwise conv
with no transpose between them.

Thread mapping: `spatial(N*OH*OW, C/V)` over the global thread index, one thread per
output pixel and vector of V consecutive channels, the channel vector fastest: a warp
reads and writes consecutive 16-byte chunks of the channel rows (coalesced). V is the
widest vector of at most 16 bytes dividing C (float16: 8 when C % 8 == 0; float32: 4),
so each chunk is aligned and lies inside one pixel's channels.

Per thread:
- weights: OHWI [C, KH, KW, 1] is [C, T] row-major (T = KH*KW taps), so the thread's V
  channels x T taps are V*T consecutive values starting at c0*T, aligned to the vector
  size (c0 is a multiple of V): T vector copies into a register array, once, when they
  fit in `PRELOAD_BYTES`; larger kernels (T > 16 in float16) load each weight where it
  is used (L1-cached, broadcast across the warp's pixels).
- taps: the window unrolled at build time (indices into the register arrays are
  constants); a tap outside the input is skipped by a predicate on its row and column
  (each check only where the geometry can cross that border, decided at build time),
  so no address outside X is formed; one vector copy per tap brings V input channels.
- accumulation in float32 (float64 for float64), bias added first, rounded once; the V
  results stored by one vector copy (fused epilogues are grafted per element).

Assumes: buffers aligned to 16 bytes (arena and weights are 64-byte aligned); the task
is a depthwise ConvNHWC (`is_depthwise`). Guarantees: correct on every shape, stride,
dilation and padding, any C (V falls to 1 for odd C), float16/bfloat16/32/64.
"""
from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from hidetc.compute.task import Task
from hidetc.schedules.cuda.common import ceil_div
from hidetc.schedules.cuda.conv_tc import ConvGeometry, conv_geometry
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.cuda import copy
from hidetc.tir.ir import Const, Expr, Function, block_idx, call, cast, logical_and, thread_idx
from hidetc.tir.mapping import spatial

THREADS = 256
VECTOR_BYTES = 16
PRELOAD_BYTES = 256    # the thread's V x T weights kept in registers up to this size


def is_depthwise(task: Task) -> bool:
    """One input and one output channel per group, more than one group."""
    geo = conv_geometry(task)
    return geo.group > 1 and geo.cg == 1 and geo.ocg == 1


def vector_width(channels: int, dtype: str) -> int:
    """Channels per thread: the widest power of two of at most 16 bytes dividing C."""
    v = VECTOR_BYTES // np.dtype(dtype).itemsize
    while v > 1 and channels % v:
        v //= 2
    return v


def build_depthwise_nhwc(task: Task, name: str) -> Function:
    geo = conv_geometry(task)
    dt = task.outputs[0].dtype
    acc_dt = "float64" if dt == "float64" else "float32"
    size = np.dtype(dt).itemsize
    v = vector_width(geo.c, dt)
    taps = geo.kh * geo.kw
    kb = KernelBuilder(name, "cuda")
    x = kb.buffer("x", dt, (geo.n, geo.h, geo.w, geo.c))
    wt = kb.buffer("w", dt, (geo.c * taps,))
    bias = kb.buffer("bias", dt, (geo.c,)) if 2 in task.buffer_inputs else None
    out = kb.buffer("out", dt, (geo.n, geo.oh, geo.ow, geo.c))
    worker = block_idx() * THREADS + thread_idx()
    mapping = spatial(geo.n, geo.oh, geo.ow, geo.c // v)
    with kb.for_mapping(mapping, worker, names=["b", "y", "xo", "cv"]) as (b, y, xo, cv):
        c0 = cv * v
        weight = _weights(kb, wt, c0, v, taps, size)
        acc = kb.alloc("acc", acc_dt, (v,))
        for e in range(v):
            init = cast(bias[c0 + e], acc_dt) if bias is not None else Const(0.0, acc_dt)
            kb.store(acc, (e,), init)
        xv = kb.alloc("xv", dt, (v,)) if v > 1 else None
        for kh in range(geo.kh):
            iy = y * geo.strides[0] - geo.begin[0] + kh * geo.dilations[0]
            for kw in range(geo.kw):
                ix = xo * geo.strides[1] - geo.begin[1] + kw * geo.dilations[1]
                conds = _inside(geo, kh, kw, iy, ix)
                with kb.if_then(logical_and(*conds)) if conds else nullcontext():
                    if xv is not None:
                        kb.emit(copy(xv[0], x[b, iy, ix, c0], v * size))
                    for e in range(v):
                        xe = xv[e] if xv is not None else x[b, iy, ix, c0]
                        we = weight(e, kh * geo.kw + kw)
                        kb.store(acc, (e,), call("fma", cast(we, acc_dt), cast(xe, acc_dt),
                                                 acc[e]))
        if v > 1:
            res = kb.alloc("res", dt, (v,))
            for e in range(v):
                kb.store(res, (e,), cast(acc[e], dt))
            kb.emit(copy(out[b, y, xo, c0], res[0], v * size))
        else:
            kb.store(out, (b, y, xo, c0), cast(acc[0], dt))
    blocks = max(ceil_div(task.outputs[0].size // v, THREADS), 1)
    return kb.finish(grid=(blocks, 1, 1), block=(THREADS, 1, 1))


def _weights(kb: KernelBuilder, wt, c0: Expr, v: int, taps: int, size: int):
    """weight(e, t): the weight of channel c0 + e at tap t, from registers preloaded by
    vector copies when the V x T block fits (and is a whole number of copies), else a
    load from the weight buffer."""
    nbytes = v * size
    if v > 1 and nbytes >= 4 and v * taps * size <= PRELOAD_BYTES:
        regs = kb.alloc("wv", wt.dtype, (v * taps,))
        for t in range(taps):
            kb.emit(copy(regs[t * v], wt[c0 * taps + t * v], nbytes))
        return lambda e, t: regs[e * taps + t]
    return lambda e, t: wt[(c0 + e) * taps + t]


def _inside(geo: ConvGeometry, kh: int, kw: int, iy: Expr, ix: Expr) -> list[Expr]:
    """The checks tap (kh, kw) needs: only borders some output can cross at that tap."""
    conds = []
    for axis, (k, i, size, out) in enumerate(((kh, iy, geo.h, geo.oh), (kw, ix, geo.w, geo.ow))):
        first = -geo.begin[axis] + k * geo.dilations[axis]
        last = (out - 1) * geo.strides[axis] + first
        if first < 0:
            conds.append(i >= 0)
        if last >= size:
            conds.append(i < size)
    return conds
