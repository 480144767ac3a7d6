"""Sliding-window geometry shared by the pooling and convolution kernels of every
target: the effective leading pads (auto_pad resolved) and a 2-D pooling's sizes."""
from __future__ import annotations

from dataclasses import dataclass

from hidetc.errors import UnsupportedOpError
from hidetc.schedules.task import Task


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
    begin: tuple[int, int]            # leading pads
    pads: tuple[int, int, int, int]   # as given (for count_include_pad)


def pool_geometry(task: Task) -> PoolGeometry:
    x_type, out_type = task.inputs[0], task.outputs[0]
    if len(x_type.shape) != 4:
        raise UnsupportedOpError(f"{task.op}: only 2-D pooling (NCHW) is supported, "
                                 f"got input rank {len(x_type.shape)}")
    n, c, h, w = x_type.shape
    oh, ow = out_type.shape[2:]
    kernel = tuple(task.attr("kernel_shape"))
    strides = tuple(task.attr("strides") or (1, 1))
    dilations = tuple(task.attr("dilations") or (1, 1))
    begin = tuple(begin_pads(task, (h, w), (oh, ow), kernel, strides, dilations))
    pads = tuple(task.attr("pads") or (0,) * 4)
    return PoolGeometry(n, c, h, w, oh, ow, kernel, strides, dilations, begin, pads)
