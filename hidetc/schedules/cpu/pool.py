"""CPU rules for 2-D pooling (NCHW): MaxPool, AveragePool, GlobalAveragePool and
GlobalMaxPool. Channels run in parallel; windows are predicated against the padding,
so any kernel, stride, padding, dilation and ceil_mode work.
"""
from __future__ import annotations

from hidetc.errors import UnsupportedOpError
from hidetc.schedules.task import Task
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Function, as_expr, cast, logical_and, maximum, minimum


def _begin_pads(task: Task, in_hw, out_hw, kernel, strides, dilations) -> list[int]:
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


def build_pool(task: Task, name: str) -> Function:
    x_type, out_type = task.inputs[0], task.outputs[0]
    if len(x_type.shape) != 4:
        raise UnsupportedOpError(f"{task.op}: only 2-D pooling (NCHW) is supported, "
                                 f"got input rank {len(x_type.shape)}")
    n, c, h, w = x_type.shape
    oh, ow = out_type.shape[2:]
    kernel = task.attr("kernel_shape")
    strides = task.attr("strides") or (1, 1)
    dilations = task.attr("dilations") or (1, 1)
    pb = _begin_pads(task, (h, w), (oh, ow), kernel, strides, dilations)
    pads = task.attr("pads") or (0,) * 4
    is_max = task.op == "MaxPool"
    dt = out_type.dtype
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (n * c, h, w))
    out = kb.buffer("out", dt, (n * c, oh, ow))
    with kb.for_range(n * c, kind="parallel", name="p") as p:
        with kb.for_range(oh, name="oh") as y, kb.for_range(ow, name="ow") as xo:
            acc = kb.declare("acc", dt, float("-inf") if is_max else 0.0)
            cnt = kb.declare("cnt", "int32", 0)
            with kb.for_range(kernel[0], name="kh") as kh, \
                    kb.for_range(kernel[1], name="kw") as kw:
                ih = y * strides[0] - pb[0] + kh * dilations[0]
                iw = xo * strides[1] - pb[1] + kw * dilations[1]
                with kb.if_then(logical_and(ih >= 0, ih < h, iw >= 0, iw < w)):
                    v = x[p, ih, iw]
                    kb.assign(acc, maximum(acc, v) if is_max else acc + v)
                    kb.assign(cnt, cnt + 1)
            if is_max:
                kb.store(out, (p, y, xo), acc)
            elif task.attr("count_include_pad", 0):
                hs, ws = y * strides[0] - pb[0], xo * strides[1] - pb[1]
                rows = minimum(hs + kernel[0], h + pads[2]) - hs
                cols = minimum(ws + kernel[1], w + pads[3]) - ws
                kb.store(out, (p, y, xo), acc / cast(rows * cols, dt))
            else:
                kb.store(out, (p, y, xo), acc / cast(maximum(cnt, 1), dt))
    return kb.finish()


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

