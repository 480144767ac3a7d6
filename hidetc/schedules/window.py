"""Sliding-window geometry shared by the pooling and convolution kernels of every
target: the effective leading pads (auto_pad resolved), a 2-D pooling's sizes, and the
body computing one pooled output (the window predicated against the padding)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.graph.ops.conv import window_geometry
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Expr, Var, cast, logical_and, maximum


def begin_pads(task: Task, in_hw, out_hw, kernel, strides, dilations) -> list[int]:
    """Leading (top, left) pads; SAME_UPPER/SAME_LOWER resolved as ONNX does."""
    auto_pad = task.attr("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", ""):
        pads = task.attr("pads") or (0,) * 4
        return [pads[0], pads[1]]
    if auto_pad == "VALID":
        return [0, 0]
    begin = []
    for n, o, k, s, d in zip(in_hw, out_hw, kernel, strides, dilations):
        total = max(0, (o - 1) * s + (k - 1) * d + 1 - n)
        begin.append(total // 2 if auto_pad == "SAME_UPPER" else total - total // 2)
    return begin


@dataclass(frozen=True)
class PoolGeometry:
    n: int
    c: int
    h: int
    w: int
    oh: int
    ow: int
    kernel: tuple[int, int]
    strides: tuple[int, int]
    dilations: tuple[int, int]
    begin: tuple[int, int]            # leading pads (auto_pad resolved)
    end: tuple[int, int]              # trailing pads (auto_pad resolved; no ceil overrun)


def pool_geometry(task: Task) -> PoolGeometry:
    x_type, out_type = task.inputs[0], task.outputs[0]
    if len(x_type.shape) != 4:
        raise UnsupportedOpError(f"{task.op}: only 2-D pooling (NCHW) is supported, "
                                 f"got input rank {len(x_type.shape)}")
    if task.op.endswith("NHWC"):
        n, h, w, c = x_type.shape
        oh, ow = out_type.shape[1:3]
    else:
        n, c, h, w = x_type.shape
        oh, ow = out_type.shape[2:]
    kernel = tuple(task.attr("kernel_shape"))
    strides = tuple(task.attr("strides") or (1, 1))
    dilations = tuple(task.attr("dilations") or (1, 1))
    win = window_geometry(task.op, (h, w), kernel, dict(task.attrs),
                          bool(task.attr("ceil_mode", 0)))
    return PoolGeometry(n, c, h, w, oh, ow, kernel, strides, dilations, win.begin, win.end)


def emit_pool_output(kb: KernelBuilder, task: Task, g: PoolGeometry, x: Buffer, out: Buffer,
                     p: Expr, y: Expr, xo: Expr, channel: Expr | None = None) -> None:
    """Store out[p, y, xo]: max or average over the window; x and out are viewed as
    (N*C, H, W) and (N*C, OH, OW). With `channel` the views are channels-last instead,
    (N, H, W, C) and (N, OH, OW, C), p the image: out[p, y, xo, channel].
    count_include_pad divides by the window clipped to the padded input (the taps inside
    the pads, dilation included; not the ceil_mode overrun: the op's reference),
    otherwise by the number of in-image taps."""
    is_max = task.op in ("MaxPool", "MaxPoolNHWC")
    dt = out.dtype
    acc = kb.declare("acc", dt, float("-inf") if is_max else 0.0)
    last = () if channel is None else (channel,)

    def take(ih: Expr, iw: Expr) -> None:
        v = x[(p, ih, iw) + last]
        kb.assign(acc, maximum(acc, v) if is_max else acc + v)
    cnt = for_each_tap(kb, g, y, xo, not is_max and task.attr("count_include_pad", 0), take)
    if is_max:
        kb.store(out, (p, y, xo) + last, acc)
    else:
        kb.store(out, (p, y, xo) + last, acc / cast(maximum(cnt, 1), dt))


def for_each_tap(kb: KernelBuilder, g: PoolGeometry, y: Expr, xo: Expr, padded: bool,
                 take: Callable[[Expr, Expr], None]) -> Var:
    """Emit take(ih, iw) for each window tap of output (y, xo) inside the image; return
    the int32 count of the taps an average divides by: those inside the image, or with
    `padded` (count_include_pad) those inside the padded input (not the ceil_mode
    overrun: the op's reference)."""
    cnt = kb.declare("cnt", "int32", 0)
    with kb.for_range(g.kernel[0], name="kh") as kh, kb.for_range(g.kernel[1], name="kw") as kw:
        ih = y * g.strides[0] - g.begin[0] + kh * g.dilations[0]
        iw = xo * g.strides[1] - g.begin[1] + kw * g.dilations[1]
        with kb.if_then(logical_and(ih >= 0, ih < g.h, iw >= 0, iw < g.w)):
            take(ih, iw)
            if not padded:
                kb.assign(cnt, cnt + 1)
        if padded:
            with kb.if_then(logical_and(ih >= -g.begin[0], ih < g.h + g.end[0],
                                        iw >= -g.begin[1], iw < g.w + g.end[1])):
                kb.assign(cnt, cnt + 1)
    return cnt
