"""CPU rules for 2-D pooling (NCHW): MaxPool, AveragePool, GlobalAveragePool and
GlobalMaxPool. Channels run in parallel; windows are predicated against the padding,
so any kernel, stride, padding, dilation and ceil_mode work. The channels-last pools
(MaxPoolNHWC, AveragePoolNHWC: `build_pool_nhwc`) run output rows in parallel and
vectorize over the channels.

Windows wholly inside the image (output rows and columns known when the kernel is built,
`window_interior`) take a branch-free body: the taps unrolled, no predicate, the
average divided by the constant window size, so gcc vectorizes the row across output
columns. Only the border outputs run the predicated body (`emit_pool_output`); one
output row is cut into left border, interior, right border.
"""
from __future__ import annotations

from hidetc.compute.task import Task
from hidetc.schedules.common.conv_geometry import window_interior
from hidetc.schedules.window import (
    PoolGeometry,
    emit_pool_output,
    for_each_tap,
    pool_geometry,
)
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Buffer,
    Const,
    Expr,
    Function,
    as_expr,
    cast,
    logical_and,
    maximum,
)
from hidetc.tir.mapping import spatial


def build_pool(task: Task, name: str) -> Function:
    g = pool_geometry(task)
    n, c, h, w, oh, ow = g.n, g.c, g.h, g.w, g.oh, g.ow
    out_type = task.outputs[0]
    dt = out_type.dtype
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (n * c, h, w))
    out = kb.buffer("out", dt, (n * c, oh, ow))
    ylo, yhi = window_interior(oh, h, g.strides[0], g.begin[0], g.kernel[0], g.dilations[0])
    xlo, xhi = window_interior(ow, w, g.strides[1], g.begin[1], g.kernel[1], g.dilations[1])

    def border(p: Expr, y: Expr, start: int, stop: int) -> None:
        if stop > start:
            with kb.for_range(stop - start, name="ow") as xo:
                emit_pool_output(kb, task, g, x, out, p, y, xo + start)

    def border_rows(p: Expr, start: int, stop: int) -> None:
        if stop > start:
            with kb.for_range(stop - start, name="oh") as y:
                border(p, y + start, 0, ow)
    with kb.for_range(n * c, kind="parallel", name="p") as p:
        if yhi <= ylo or xhi <= xlo:
            border_rows(p, 0, oh)
        else:   # three row ranges, no branch in the loops (gcc thought one cold)
            border_rows(p, 0, ylo)
            with kb.for_range(yhi - ylo, name="oh") as yi:
                y = yi + ylo
                border(p, y, 0, xlo)
                with kb.for_range(xhi - xlo, name="ow") as xo:
                    _interior_output(kb, task.op == "MaxPool", g, x, out, p, y, xo + xlo)
                border(p, y, xhi, ow)
            border_rows(p, yhi, oh)
    return kb.finish()


def _interior_output(kb: KernelBuilder, is_max: bool, g: PoolGeometry, x: Buffer,
                     out: Buffer, p: Expr, y: Expr, xo: Expr) -> None:
    """out[p, y, xo] for a window inside the image: every tap counts (with or without
    count_include_pad), no predicate."""
    dt = out.dtype
    acc = kb.declare("acc", dt, float("-inf") if is_max else 0.0)
    for kh in range(g.kernel[0]):
        for kw in range(g.kernel[1]):
            v = x[p, y * g.strides[0] - g.begin[0] + kh * g.dilations[0],
                  xo * g.strides[1] - g.begin[1] + kw * g.dilations[1]]
            kb.assign(acc, maximum(acc, v) if is_max else acc + v)
    taps = g.kernel[0] * g.kernel[1]
    kb.store(out, (p, y, xo), acc if is_max else acc / as_expr(float(taps), acc))


def build_global_pool(task: Task, name: str) -> Function:
    x_type = task.inputs[0]
    nc = x_type.shape[0] * x_type.shape[1]
    spatial_size = x_type.size // max(nc, 1)
    is_max = task.op == "GlobalMaxPool"
    dt = x_type.dtype
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (nc, spatial_size))
    out = kb.buffer("out", dt, (nc,))
    with kb.for_range(nc, kind="parallel", name="p") as p:
        acc = kb.declare("acc", dt, float("-inf") if is_max else 0.0)
        with kb.for_range(spatial_size, name="k") as k:
            kb.assign(acc, maximum(acc, x[p, k]) if is_max else acc + x[p, k])
        kb.store(out, (p,), acc if is_max else acc / as_expr(float(spatial_size), acc))
    return kb.finish()


def build_pool_nhwc(task: Task, name: str) -> Function:
    """MaxPoolNHWC / AveragePoolNHWC: tasks of one output row (image, oy). Outputs whose
    window lies inside the image (rows checked at run time, columns known at build
    time: `window_interior`) take every tap in one expression per channel, divided by
    the window size; the others accumulate their valid taps in a local row of C values
    (a check per tap, uniform over the channels), then store it (averages divided by
    the count the NCHW rule uses: `emit_pool_output`). The channel loops are
    contiguous, so gcc vectorizes them."""
    g = pool_geometry(task)
    dt = task.outputs[0].dtype
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (g.n, g.h, g.w, g.c))
    out = kb.buffer("out", dt, (g.n, g.oh, g.ow, g.c))
    ylo, yhi = window_interior(g.oh, g.h, g.strides[0], g.begin[0], g.kernel[0], g.dilations[0])
    xlo, xhi = window_interior(g.ow, g.w, g.strides[1], g.begin[1], g.kernel[1], g.dilations[1])
    with kb.for_range(g.n * g.oh, kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(g.n, g.oh), p, names=["b", "oy"]) as (b, oy):
            row = _NHWCRow(kb, task, g, x, out, b, oy, kb.alloc("acc", dt, (g.c,)))
            if yhi <= ylo or xhi <= xlo:
                row.checked(0, g.ow)
            else:
                with kb.if_then(logical_and(oy >= ylo, oy < yhi)):
                    row.checked(0, xlo)
                    row.interior(xlo, xhi)
                    row.checked(xhi, g.ow)
                with kb.otherwise():
                    row.checked(0, g.ow)
    return kb.finish()


class _NHWCRow:
    """The emitters of one NHWC pooling task (output row oy of image b)."""

    def __init__(self, kb, task, g, x, out, b, oy, acc):
        self.kb, self.g, self.x, self.out, self.b, self.oy, self.acc = kb, g, x, out, b, oy, acc
        self.is_max = task.op == "MaxPoolNHWC"
        self.padded = not self.is_max and bool(task.attr("count_include_pad", 0))

    def interior(self, lo: int, hi: int) -> None:
        kb, g = self.kb, self.g
        with kb.for_range(hi - lo, name="ox") as i, kb.for_range(g.c, name="c") as c:
            ox = i + lo
            total = None
            for kh in range(g.kernel[0]):
                for kw in range(g.kernel[1]):
                    v = self.x[self.b, self.oy * g.strides[0] - g.begin[0] + kh * g.dilations[0],
                               ox * g.strides[1] - g.begin[1] + kw * g.dilations[1], c]
                    total = v if total is None else (maximum(total, v) if self.is_max
                                                     else total + v)
            taps = g.kernel[0] * g.kernel[1]
            kb.store(self.out, (self.b, self.oy, ox, c),
                     total if self.is_max else total / as_expr(float(taps), total))

    def checked(self, lo: int, hi: int) -> None:
        kb, g, acc = self.kb, self.g, self.acc
        if hi <= lo:
            return
        with kb.for_range(hi - lo, name="ox") as i:
            ox = i + lo
            with kb.for_range(g.c, name="c") as c:
                kb.store(acc, (c,), Const(float("-inf") if self.is_max else 0.0, acc.dtype))

            def take(ih: Expr, iw: Expr) -> None:
                with kb.for_range(g.c, name="c") as c:
                    v = self.x[self.b, ih, iw, c]
                    kb.store(acc, (c,), maximum(acc[c], v) if self.is_max else acc[c] + v)
            cnt = for_each_tap(kb, g, self.oy, ox, self.padded, take)
            with kb.for_range(g.c, name="c") as c:
                value = acc[c] if self.is_max else acc[c] / cast(maximum(cnt, 1), acc.dtype)
                kb.store(self.out, (self.b, self.oy, ox, c), value)
