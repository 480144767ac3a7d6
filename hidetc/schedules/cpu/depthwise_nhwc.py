"""CPU kernel for channels-last depthwise convolution (ConvNHWC with one input and one
output channel per group: MobileNet's 3x3 depthwise convs once `choose_layout` has
made the network NHWC).

Schedule: `spatial(N, OH, channel blocks)` tasks over one OpenMP-parallel loop, each
one output row of `DepthwiseNHWCConfig.cblock` channels. Channels are the innermost,
contiguous dimension of input, weights and output, so every loop over them vectorizes
with plain loads (no strided or shuffled access whatever the stride):

- interior outputs (every tap inside the image; rows checked at run time, columns
  known at build time) sum all KH*KW taps in one expression per channel and store once;
- border outputs accumulate their valid taps (a check per tap, uniform over the
  channels) in a local row of accumulators, then store it.

Weights: [KH*KW, C] (`prepack_weights`, done when the model is compiled: a tap's
channels contiguous) or, not prepacked, the OHWI constant [C, KH, KW, 1] read in place.

Guarantees: correct for every config on every depthwise shape (strides, dilations,
pads, any C); no load outside the image. Assumes C/G = OC/G = 1 (`supports`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hidetc.schedules.common.conv_geometry import ConvGeometry
from hidetc.schedules.cpu.microkernel import tile_extent
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Const, Expr, ExprLike, Function, logical_and
from hidetc.tir.mapping import spatial


@dataclass(frozen=True)
class DepthwiseNHWCConfig:
    """Channels per parallel task (a task is one output row of them)."""
    cblock: int = 128


DEPTHWISE_NHWC_SPACE = tuple(DepthwiseNHWCConfig(c) for c in (16, 32, 64, 128, 256, 1024))


def supports(geo: ConvGeometry) -> bool:
    return geo.channels_last and geo.depthwise and geo.ocg == 1


def prepack_weights(geo: ConvGeometry, w: np.ndarray) -> np.ndarray:
    """OHWI [C, KH, KW, 1] -> [KH*KW, C]."""
    return np.ascontiguousarray(np.asarray(w).reshape(geo.c, geo.taps).T)


@dataclass(frozen=True)
class _Row:
    """One task: image b, output row oy, channels c0 .. c0 + cn."""
    kb: KernelBuilder
    geo: ConvGeometry
    x: Buffer
    w: Buffer
    bias: Buffer | None
    out: Buffer
    prepacked: bool
    b: Expr
    oy: Expr
    c0: Expr
    cn: ExprLike

    def weight(self, t: int, c: ExprLike) -> Expr:
        return self.w[t, c] if self.prepacked else self.w[c, t]

    def tap(self, kh: int, kw: int, ox: ExprLike) -> tuple[Expr, Expr]:
        g = self.geo
        return (self.oy * g.strides[0] - g.pads[0] + kh * g.dilations[0],
                ox * g.strides[1] - g.pads[1] + kw * g.dilations[1])

    def store(self, ox: ExprLike, c: Expr, value: Expr) -> None:
        ch = self.c0 + c
        if self.bias is not None:
            value = value + self.bias[ch]
        self.kb.store(self.out, (self.b, self.oy, ox, ch), value)

    def fused(self, lo: int, hi: int) -> None:
        """Outputs lo .. hi of the row, every tap inside the image."""
        kb, g = self.kb, self.geo
        with kb.for_range(hi - lo, name="ox") as i, kb.for_range(self.cn, name="c") as c:
            ox, ch = i + lo, self.c0 + c
            total = None
            for t in range(g.taps):
                iy, ix = self.tap(*divmod(t, g.kw), ox)
                term = self.x[self.b, iy, ix, ch] * self.weight(t, ch)
                total = term if total is None else total + term
            self.store(ox, c, total)

    def checked(self, acc: Buffer, lo: ExprLike, count: ExprLike) -> None:
        """Outputs lo .. lo + count of the row, taps checked against the image."""
        kb, g = self.kb, self.geo
        with kb.for_range(count, name="ox") as i:
            ox = i + lo
            with kb.for_range(self.cn, name="c") as c:
                kb.store(acc, (c,), Const(0.0, acc.dtype))
            for t in range(g.taps):
                iy, ix = self.tap(*divmod(t, g.kw), ox)
                with kb.if_then(logical_and(iy >= 0, iy < g.h, ix >= 0, ix < g.w)):
                    with kb.for_range(self.cn, name="c") as c:
                        ch = self.c0 + c
                        kb.store(acc, (c,), acc[c] + self.x[self.b, iy, ix, ch]
                                 * self.weight(t, ch))
            with kb.for_range(self.cn, name="c") as c:
                self.store(ox, c, acc[c])


def build_depthwise_nhwc(geo: ConvGeometry, cfg: DepthwiseNHWCConfig, dt: str, name: str,
                         prepacked: bool = False) -> Function:
    if not supports(geo):
        raise ValueError("the channels-last depthwise kernel takes C/G = OC/G = 1")
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (geo.n, geo.h, geo.w, geo.c))
    w = kb.buffer("w", dt, (geo.taps, geo.c) if prepacked else (geo.oc, geo.taps))
    bias = kb.buffer("bias", dt, (geo.oc,)) if geo.has_bias else None
    out = kb.buffer("out", dt, (geo.n, geo.oh, geo.ow, geo.oc))
    if geo.n * geo.oc * geo.oh * geo.ow == 0:
        return kb.finish()
    cb = max(1, min(cfg.cblock, geo.c))
    blocks = -(-geo.c // cb)
    (ylo, yhi), (xlo, xhi) = geo.interior()
    with kb.for_range(geo.n * geo.oh * blocks, kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(geo.n, geo.oh, blocks), p, names=["b", "oy", "cb"]) \
                as (b, oy, cbi):
            c0 = cbi * cb
            row = _Row(kb, geo, x, w, bias, out, prepacked, b, oy, c0,
                       tile_extent(geo.c, c0, cb))
            acc = kb.alloc("acc", dt, (cb,))
            if yhi <= ylo or xhi <= xlo:       # no output has every tap inside
                row.checked(acc, 0, geo.ow)
            else:
                with kb.if_then(logical_and(oy >= ylo, oy < yhi)):
                    row.checked(acc, 0, xlo)
                    row.fused(xlo, xhi)
                    row.checked(acc, xhi, geo.ow - xhi)
                with kb.otherwise():
                    row.checked(acc, 0, geo.ow)
    return kb.finish()
