"""CPU direct kernel for depthwise-style convolution: one input channel per group and
more than one group (MobileNet's 3x3 depthwise convs, channel multipliers included).

Schedule: `spatial(N, OC, row_blocks)` tasks over one OpenMP-parallel loop, each doing
`rows` output rows of one output channel; the channel's KH*KW weights live in scalars.

- fused (`DepthwiseConfig.fused`): an *interior* output row (every kh tap inside the
  image) computes its interior columns (every kw tap inside) in one loop over ox whose
  body sums all taps into one value -- gcc vectorizes it over ox (contiguous loads for
  stride 1, strided for stride 2) and stores each output once. The few border columns
  of that row sum only their valid taps (known at build time: no predicates). Border
  rows take the row path below.
- flat band (fused, and SH * W == SW * OW: stride 1 keeping the width): the interior
  rows of a task run as one loop over their flattened outputs, border columns
  included, then those border columns are computed again right (`_flat_band`): the
  long loop vectorizes fully on small planes (bench/results/2026-12-06-decision-notes.md).
  X and out are viewed as [N, C, H*W] so fused neighbours index them correctly.
- row path (always for border rows, for every row when not fused): the output row
  accumulates in a local row buffer, tap by tap; each tap's loop runs over exactly its
  valid output columns (build-time bounds), contiguous in the buffer, so it vectorizes.

Guarantees: correct for every config on every shape; every load is inside the image
(ranges are computed at build time, rows checked at run time), no clamping.
"""
from __future__ import annotations

from dataclasses import dataclass

from hidetc.schedules.common.conv_geometry import ConvGeometry, valid_range
from hidetc.schedules.cpu.microkernel import tile_extent
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Buffer,
    Const,
    Expr,
    ExprLike,
    Function,
    call,
    logical_and,
    logical_or,
    maximum,
    minimum,
)
from hidetc.tir.mapping import spatial


@dataclass(frozen=True)
class DepthwiseConfig:
    """Output rows per parallel task; whether interior rows sum all taps in one pass.
    Default 4 rows: a task that covers a small plane whole (a constant row loop) lets
    gcc unroll the fused loops completely into scalar code (3x slower at 14x14)."""
    rows: int = 4
    fused: bool = True


DEPTHWISE_SPACE = tuple(DepthwiseConfig(r, f) for f in (True, False)
                        for r in (2, 4, 8, 16, 32, 64))


@dataclass(frozen=True)
class _Ctx:
    """What every emitter needs: the builder, geometry, buffers, task indices and the
    channel's tap weights (scalars)."""
    kb: KernelBuilder
    geo: ConvGeometry
    x: Buffer
    out: Buffer
    b: Expr
    o: Expr
    ch: ExprLike
    taps: tuple
    init: Expr

    def tap(self, kh: int, kw: int) -> Expr:
        return self.taps[kh * self.geo.kw + kw]

    def load(self, iy: ExprLike, ix: ExprLike) -> Expr:
        """X[b, ch, iy, ix] (the kernel views X as [N, C, H*W])."""
        return self.x[self.b, self.ch, iy * self.geo.w + ix]

    def store(self, y: ExprLike, ox: ExprLike, value: Expr) -> None:
        """out[b, o, y, ox] = value (the kernel views out as [N, OC, OH*OW])."""
        self.kb.store(self.out, (self.b, self.o, y * self.geo.ow + ox), value)

    def in_row(self, y: ExprLike, kh: int) -> ExprLike:
        return y * self.geo.strides[0] + (kh * self.geo.dilations[0] - self.geo.pads[0])

    def in_col(self, ox: ExprLike, kw: int) -> ExprLike:
        return ox * self.geo.strides[1] + (kw * self.geo.dilations[1] - self.geo.pads[1])


def build_depthwise(geo: ConvGeometry, cfg: DepthwiseConfig, dt: str, name: str) -> Function:
    rows = max(1, min(cfg.rows, geo.oh))
    tiles = (geo.n, geo.oc, -(-geo.oh // rows))
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (geo.n, geo.c, geo.h * geo.w))
    wt = kb.buffer("w", dt, (geo.oc, geo.taps))
    bias = kb.buffer("bias", dt, (geo.oc,)) if geo.has_bias else None
    out = kb.buffer("out", dt, (geo.n, geo.oc, geo.oh * geo.ow))
    if geo.n * geo.oc * geo.oh * geo.ow == 0:
        return kb.finish()
    with kb.for_range(tiles[0] * tiles[1] * tiles[2], kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(*tiles), p, names=["b", "o", "yb"]) as (b, o, yb):
            ch = o // geo.ocg if geo.ocg > 1 else o
            taps = tuple(kb.declare("wv", dt, wt[o, t]) for t in range(geo.taps))
            init = bias[o] if bias is not None else Const(0.0, dt)
            ctx = _Ctx(kb, geo, x, out, b, o, ch, taps, init)
            acc = kb.alloc("acc", dt, (geo.ow,))
            if cfg.fused and _flat(geo):
                _flat_band(ctx, acc, yb * rows, tile_extent(geo.oh, yb * rows, rows))
            else:
                phases = None
                if cfg.fused and geo.strides[1] > 1:
                    sw = geo.strides[1]
                    phases = kb.alloc("phases", dt, (geo.kh, sw, -(-geo.w // sw)))
                with kb.for_range(tile_extent(geo.oh, yb * rows, rows), name="t") as t:
                    _output_row(ctx, cfg, acc, yb * rows + t, phases)
    return kb.finish()


def _flat(geo: ConvGeometry) -> bool:
    """Whether consecutive outputs of the interior band, row ends included, read
    X at one fixed stride: when SH * W == SW * OW (stride 1 with the width kept, as
    MobileNet's), output i = y*OW + ox reads X[SW*i + tap offset] in the flattened
    plane."""
    sh, sw = geo.strides
    return sh * geo.w == sw * geo.ow and _interior_box(geo) is not None


def _interior_box(geo: ConvGeometry):
    (y0, y1), (x0, x1) = geo.interior()
    return None if y1 <= y0 or x1 <= x0 else (y0, y1, x0, x1)


def _flat_band(ctx: _Ctx, acc: Buffer, first: Expr, count: ExprLike) -> None:
    """Output rows first .. first+count-1 of one channel. Their interior band (rows
    whose taps are all inside the image) runs as ONE loop over the flattened outputs
    from its first interior pixel to its last: a long contiguous loop that vectorizes
    fully, where a 14-wide row gave 8 + 4 lanes and scalar ends. The reads stay inside
    the plane (they lie between the first and the last interior pixel's), but the
    border columns it crosses get wrong values: they are computed again, each with its
    valid taps only, right after (stored twice, the second time right). Border rows
    take the row path."""
    geo, kb = ctx.geo, ctx.kb
    y0, y1, x0, x1 = _interior_box(geo)
    s = geo.strides[1]
    lo = kb.declare("band_lo", "int32", maximum(first, y0))
    hi = kb.declare("band_hi", "int32", minimum(first + count, y1))
    start = lo * geo.ow + x0
    with kb.for_range((hi - 1) * geo.ow + x1 - start, name="i") as i:
        idx = start + i
        value = ctx.init
        for kh in range(geo.kh):
            for kw in range(geo.kw):
                off = (kh * geo.dilations[0] - geo.pads[0]) * geo.w + \
                    kw * geo.dilations[1] - geo.pads[1]
                value = call("fma", ctx.tap(kh, kw), ctx.x[ctx.b, ctx.ch, idx * s + off], value)
        kb.store(ctx.out, (ctx.b, ctx.o, idx), value)
    with kb.for_range(hi - lo, name="t") as t:
        _border_columns(ctx, lo + t, x0, x1)
    with kb.for_range(count, name="t") as t:
        y = first + t
        with kb.if_then(logical_or(y < y0, y >= y1)):
            _accumulated_row(ctx, acc, y)


def _output_row(ctx: _Ctx, cfg: DepthwiseConfig, acc: Buffer, y: Expr,
                phases: Buffer | None = None) -> None:
    geo, kb = ctx.geo, ctx.kb
    (y0, y1), (x0, x1) = geo.interior()
    if not cfg.fused or y1 <= y0 or x1 <= x0:
        _accumulated_row(ctx, acc, y)
        return
    if (y0, y1) == (0, geo.oh):
        _fused_row(ctx, y, x0, x1, phases)
        return
    with kb.if_then(logical_and(y >= y0, y < y1)):
        _fused_row(ctx, y, x0, x1, phases)
    with kb.otherwise():
        _accumulated_row(ctx, acc, y)


def _fused_row(ctx: _Ctx, y: Expr, x0: int, x1: int, phases: Buffer | None = None) -> None:
    """An interior row: all taps summed per output; interior columns in one loop. With
    `phases` (a column stride SW > 1) the KH input rows are first split into their SW
    column phases, phases[kh][q][i] = X[row kh][SW*i + q], so each tap reads
    consecutive values instead of strided loads gcc vectorizes with a shuffle per tap
    (bench/results/2026-12-06-decision-notes.md)."""
    geo, kb = ctx.geo, ctx.kb
    if phases is not None:
        _split_phases(ctx, y, phases)
    sw = geo.strides[1]
    with kb.for_range(x1 - x0, name="ox") as i:
        ox = i + x0 if x0 else i
        value = ctx.init
        for kh in range(geo.kh):
            for kw in range(geo.kw):
                if phases is None:
                    src = ctx.load(ctx.in_row(y, kh), ctx.in_col(ox, kw))
                else:      # column SW*ox + c = SW*(ox + (c - q)/SW) + q, q = c mod SW
                    c = kw * geo.dilations[1] - geo.pads[1]
                    src = phases[kh, c % sw, ox + (c - c % sw) // sw]
                value = call("fma", ctx.tap(kh, kw), src, value)
        ctx.store(y, ox, value)
    _border_columns(ctx, y, x0, x1)


def _split_phases(ctx: _Ctx, y: Expr, phases: Buffer) -> None:
    """phases[kh][q][i] = X[in_row(y, kh)][SW*i + q] for every i with SW*i + q < W."""
    geo, kb = ctx.geo, ctx.kb
    sw = geo.strides[1]
    for kh in range(geo.kh):
        row = ctx.in_row(y, kh)
        for q in range(sw):
            with kb.for_range(-(-(geo.w - q) // sw), name="i") as i:
                kb.store(phases, (kh, q, i), ctx.load(row, i * sw + q))


def _border_columns(ctx: _Ctx, y: Expr, x0: int, x1: int) -> None:
    """The columns outside [x0, x1) of an interior row: their valid taps only."""
    geo = ctx.geo
    for ox in list(range(x0)) + list(range(x1, geo.ow)):
        value = ctx.init
        for kh in range(geo.kh):
            for kw in range(geo.kw):
                if 0 <= ctx.in_col(ox, kw) < geo.w:
                    src = ctx.load(ctx.in_row(y, kh), ctx.in_col(ox, kw))
                    value = call("fma", ctx.tap(kh, kw), src, value)
        ctx.store(y, ox, value)


def _accumulated_row(ctx: _Ctx, acc: Buffer, y: Expr) -> None:
    """Any row: acc = bias, then acc[ox] += w * X over each valid tap's valid columns."""
    geo, kb = ctx.geo, ctx.kb
    with kb.for_range(geo.ow, name="ox") as ox:
        kb.store(acc, (ox,), ctx.init)
    for kh in range(geo.kh):
        lo, hi = valid_range(geo.oh, geo.h, geo.strides[0], geo.pads[0],
                             kh * geo.dilations[0])
        if hi <= lo:
            continue
        if (lo, hi) == (0, geo.oh):
            _accumulate_taps(ctx, acc, y, kh)
            continue
        with kb.if_then(logical_and(y >= lo, y < hi)):
            _accumulate_taps(ctx, acc, y, kh)
    with kb.for_range(geo.ow, name="ox") as ox:
        ctx.store(y, ox, acc[ox])


def _accumulate_taps(ctx: _Ctx, acc: Buffer, y: Expr, kh: int) -> None:
    geo, kb = ctx.geo, ctx.kb
    for kw in range(geo.kw):
        lo, hi = valid_range(geo.ow, geo.w, geo.strides[1], geo.pads[1], kw * geo.dilations[1])
        with kb.for_range(max(0, hi - lo), name="ox") as i:
            ox = i + lo if lo else i
            src = ctx.load(ctx.in_row(y, kh), ctx.in_col(ox, kw))
            kb.store(acc, (ox,), call("fma", ctx.tap(kh, kw), src, acc[ox]))
