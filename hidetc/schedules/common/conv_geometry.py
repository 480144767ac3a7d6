"""Geometry of a 2-D convolution task (Conv, ConvInteger: NCHW, OIHW weights; ConvNHWC,
ConvIntegerNHWC: NHWC, OHWI weights, `channels_last`): sizes, groups, strides,
dilations and the begin pads (auto_pad resolved), for both targets (the CPU conv
templates, the CUDA implicit-GEMM conv and `build_kernel`'s depthwise routing), plus the
valid-range helpers
(`valid_range`, `window_interior`) the CPU conv and pooling schedules use to keep every
load inside the image without predicates.
"""
from __future__ import annotations

from dataclasses import dataclass

from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.window import begin_pads

CHANNELS_LAST = ("ConvNHWC", "ConvIntegerNHWC")
BIASED = ("Conv", "ConvNHWC")    # input 2 a bias (the integer convs': a zero point)


@dataclass(frozen=True)
class ConvGeometry:
    n: int
    c: int
    h: int
    w: int
    oc: int
    kh: int
    kw: int
    oh: int
    ow: int
    groups: int
    strides: tuple[int, int]
    dilations: tuple[int, int]
    pads: tuple[int, int]   # top, left
    has_bias: bool
    channels_last: bool = False   # ConvNHWC: X [N, H, W, C], W [OC, KH, KW, C/G]

    @property
    def icg(self) -> int:
        return self.c // self.groups

    @property
    def ocg(self) -> int:
        return self.oc // self.groups

    @property
    def taps(self) -> int:
        return self.kh * self.kw

    @property
    def depthwise(self) -> bool:
        return self.icg == 1 and self.groups > 1

    def interior(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """Output rows [y0, y1) and columns [x0, x1) whose every tap is inside the
        input (`window_interior`; empty ranges when none is)."""
        return (window_interior(self.oh, self.h, self.strides[0], self.pads[0], self.kh,
                                self.dilations[0]),
                window_interior(self.ow, self.w, self.strides[1], self.pads[1], self.kw,
                                self.dilations[1]))

    @property
    def pointwise(self) -> bool:
        return ((self.kh, self.kw, self.strides, self.pads) == (1, 1, (1, 1), (0, 0))
                and (self.oh, self.ow) == (self.h, self.w))


def conv_geometry(task: Task) -> ConvGeometry:
    x_type, w_type, out_type = task.inputs[0], task.inputs[1], task.outputs[0]
    if len(x_type.shape) != 4:
        raise UnsupportedOpError(f"Conv: only 2-D convolution is supported, "
                                 f"got input rank {len(x_type.shape)}")
    last = task.op in CHANNELS_LAST
    if last:
        n, h, w, c = x_type.shape
        oc, kh, kw, _ = w_type.shape
        oh, ow = out_type.shape[1:3]
    else:
        n, c, h, w = x_type.shape
        oc, _, kh, kw = w_type.shape
        oh, ow = out_type.shape[2:]
    strides = tuple(task.attr("strides") or (1, 1))
    dil = tuple(task.attr("dilations") or (1, 1))
    pads = tuple(begin_pads(task, (h, w), (oh, ow), (kh, kw), strides, dil))
    return ConvGeometry(n, c, h, w, oc, kh, kw, oh, ow, task.attr("group", 1), strides,
                        dil, pads, 2 in task.buffer_inputs and task.op in BIASED, last)



def valid_range(out: int, size: int, stride: int, pad: int, offset: int) -> tuple[int, int]:
    """Output positions o in [lo, hi) with 0 <= o * stride - pad + offset < size."""
    lo = 0
    while lo < out and lo * stride - pad + offset < 0:
        lo += 1
    hi = lo
    while hi < out and hi * stride - pad + offset < size:
        hi += 1
    return lo, hi


def window_interior(out: int, size: int, stride: int, begin: int, kernel: int,
                    dilation: int) -> tuple[int, int]:
    """Output positions [lo, hi) whose whole window (`kernel` taps `dilation` apart)
    lies inside [0, size) (hi <= lo: none)."""
    ranges = [valid_range(out, size, stride, begin, k * dilation) for k in range(kernel)]
    return max(r[0] for r in ranges), min(r[1] for r in ranges)
