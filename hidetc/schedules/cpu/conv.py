"""CPU rule for 2-D convolution (NCHW, OIHW weights, groups, strides, pads, dilations).

Schedule: (image, output channel) pairs run in parallel; the output plane starts at the
bias, then for each input channel of the group and each kernel tap (taps unrolled at
build time) the valid output rectangle, computed at build time so no load needs a
predicate, accumulates weight * input with the innermost loop over output columns.
Depthwise convolution is the groups == channels case. The template issue replaces this
with implicit GEMM.
"""
from __future__ import annotations

from hidetc.errors import UnsupportedOpError
from hidetc.schedules.cpu.pool import _begin_pads
from hidetc.schedules.task import Task
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Const, Function
from hidetc.tir.mapping import spatial


def _valid_range(out: int, size: int, stride: int, pad: int, offset: int) -> tuple[int, int]:
    """Output positions o in [lo, hi) with 0 <= o * stride - pad + offset < size."""
    lo = 0
    while lo < out and lo * stride - pad + offset < 0:
        lo += 1
    hi = lo
    while hi < out and hi * stride - pad + offset < size:
        hi += 1
    return lo, hi


def build_conv(task: Task, name: str) -> Function:
    x_type, w_type, out_type = task.inputs[0], task.inputs[1], task.outputs[0]
    if len(x_type.shape) != 4:
        raise UnsupportedOpError(f"Conv: only 2-D convolution is supported, "
                                 f"got input rank {len(x_type.shape)}")
    n, c, h, w = x_type.shape
    oc, icg, kh_n, kw_n = w_type.shape
    _, _, oh, ow = out_type.shape
    groups = task.attr("group", 1)
    ocg = oc // groups
    strides = task.attr("strides") or (1, 1)
    dil = task.attr("dilations") or (1, 1)
    pb = _begin_pads(task, (h, w), (oh, ow), (kh_n, kw_n), strides, dil)
    has_bias = 2 in task.buffer_inputs
    dt = out_type.dtype
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (n, c, h, w))
    wt = kb.buffer("w", dt, (oc, icg, kh_n, kw_n))
    bias = kb.buffer("bias", dt, (oc,)) if has_bias else None
    out = kb.buffer("out", dt, (n, oc, oh, ow))
    with kb.for_range(n * oc, kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(n, oc), p, names=["b", "o"]) as (b, o):
            init = bias[o] if bias is not None else Const(0.0, dt)
            with kb.for_range(oh, name="y") as y, kb.for_range(ow, name="x") as xo:
                kb.store(out, (b, o, y, xo), init)
            with kb.for_range(icg, name="ic") as ic:
                ch = (o // ocg) * icg + ic if groups > 1 else ic
                for kh in range(kh_n):
                    ylo, yhi = _valid_range(oh, h, strides[0], pb[0], kh * dil[0])
                    for kw in range(kw_n):
                        xlo, xhi = _valid_range(ow, w, strides[1], pb[1], kw * dil[1])
                        if yhi <= ylo or xhi <= xlo:
                            continue
                        wv = kb.declare("wv", dt, wt[o, ic, kh, kw])
                        with kb.for_range(yhi - ylo, name="y") as ty:
                            y = ty + ylo if ylo else ty
                            iy = y * strides[0] + (kh * dil[0] - pb[0])
                            with kb.for_range(xhi - xlo, name="x") as tx:
                                xo = tx + xlo if xlo else tx
                                ix = xo * strides[1] + (kw * dil[1] - pb[1])
                                kb.store(out, (b, o, y, xo),
                                         out[b, o, y, xo] + wv * x[b, ch, iy, ix])
    return kb.finish()
