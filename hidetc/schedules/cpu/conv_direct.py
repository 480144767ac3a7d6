"""The direct convolution: a CPU Conv schedule with no im2col (f32 micro-kernel in AVX2).

It is the implicit GEMM transposed: per image and group,

    out^T[P, OC/G] = X'[P, C/G*KH*KW] x W^T[C/G*KH*KW, OC/G]      (P = OH*OW positions)

so the micro-kernel's MR rows are output *positions* and its NR columns output
*channels*. Row r of X' at k = (ci, kh, kw) is the input element under tap (kh, kw) of
position p: one scalar, broadcast straight from the input at

    xsrc[ci][off(p) + kh*DH*WP + kw*DW],   off(p) = (p / OW) * SH * WP + (p % OW) * SW

where xsrc is the input itself when the conv has no padding, else a zero-padded copy
[C, HP, WP] made once per call (a parallel loop before the tasks: HP and WP just cover
every tap of every output). Nothing is gathered per task, any map width works (a
micro-tile's positions may span output rows: each row keeps its own offset) and strides
and dilations are only different offsets. W^T comes in NR-wide panels
[G, OC/G / NR, C/G*KH*KW, NR] (`prepack_weights`: packed when the model is compiled
for constant weights, else once per call), so the B loads are contiguous.

The K loop runs over the block's channels with the KH*KW taps unrolled
(`avx2.micro_kernel_taps`): per step, MR broadcasts at fixed offsets from MR row
pointers and NR/8 vector loads of the weights panel. Blocking, task shapes and cbuf
accumulation are the GEMM's (`microkernel.blocking`, K blocks a whole number of
channels); the final store writes each output channel's run of positions (contiguous
in NCHW), adding the bias.

Measured (2-core Zen 3, prepacked weights, best config of each schedule, kernels alone
and warm): 0.86x the implicit GEMM's time on ResNet-50's 7x7 3x3 convs, 0.80x on
Inception-V3's 35->17 stride-2 3x3, 0.90x on 1x1 convs over 7x7 maps, about even on
14x14 and 28x28, 1.1-1.7x on 56x56 and larger maps and on the 7x7 stride-2 stem. Inside
models the narrow-panel configs (5 x 16, 6 x 16) lost what they won alone (they re-read
the input block once per 16 output channels); the wide ones (3 x 32, 4 x 24) held, so
the tuner's short list tries those first on maps of at most 400 positions
(`conv.DIRECT_POSITIONS`), and the rest only in a full-space tuning (level 2).

Channels-last (ConvNHWC, `geo.channels_last`: X [N, H*W, C], out [N, P, OC], OHWI
weights packed with k in (kh, kw, ci) order): the input element of position p under tap
t for channel ci sits at xsrc[off(p) + tap(t)][ci], so per tap each of the MR rows
walks one pointer along contiguous channels -- the GEMM micro-kernel with A read in
place. Each micro-tile sums the *whole* K in registers (`_registers_last`: taps
unrolled, one channel loop each; no K blocks, no cbuf) when KC = 0, then goes out
through an MR x NR tile buffer, the store running along contiguous output channels
(vectorized, epilogues grafted on it). With one group and no horizontal dilation a
kernel row's KW taps are one run of KW*C contiguous values (`_runs`). KC > 0 cuts the
runs into K blocks accumulated in cbuf (`_accumulate_last`), which keeps a KC x NR
chunk of the weights in L1 across the micro-tiles: the tuner picks it for big K on
small maps (ResNet-50's 1x1 2048 -> 512 on 7x7: 0.66 ms against 1.28 ms in registers,
kernels alone). The zero-padded copy is [N, HP*WP, C]. MC blocks the positions whose
input stays cached while the NR-channel panels go by. Inside ResNet-50 channels-last
beat the NCHW implicit GEMM and direct kernels (1.06x against 1.17x of ONNX Runtime,
paired rounds); the variant with the channels innermost under unrolled taps (the NCHW
loop) was slower than the GEMM on 3x3 convs (MR x taps broadcast addresses per
channel).

Guarantees: correct for every config on every conv shape it is built for (not
depthwise: `conv.py` sends those to `depthwise.py`); positions past P are clamped to
the last one on load and never stored; output channels past OC/G read zero weights
from the padded last panel and are never stored; no load outside the input or its
padded copy. f32 only (the Conv template keeps other dtypes on the GEMM schedule).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from hidetc.schedules.cpu import avx2
from hidetc.schedules.cpu.conv_geometry import ConvGeometry
from hidetc.schedules.cpu.microkernel import (
    LANES,
    MICRO_SHAPES,
    Blocking,
    GemmConfig,
    blocking,
    ceil_div,
    may_have_narrow_tail,
    tile_extent,
)
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Buffer,
    Const,
    Expr,
    ExprLike,
    Function,
    Var,
    logical_and,
    minimum,
    select,
)
from hidetc.tir.mapping import spatial


@dataclass(frozen=True)
class DirectConfig:
    """Knobs of the direct convolution: micro-tile MR positions x NR output channels,
    MC positions per L2 block, NC output channels per task, KC = K block depth (rounded
    down to whole input channels)."""
    mr: int = 6
    nr: int = 16
    mc: int = 64
    nc: int = 192
    kc: int = 256

    def gemm(self) -> GemmConfig:
        return GemmConfig(self.mr, self.nr, self.mc, self.nc, self.kc, pack_a=False,
                          pack_b=False)


# The tuner's first direct configs on small maps (`ConvTemplate.short_list`): NR >= 24
# only. 5 x 16 and 6 x 16 won more sweeps of kernels alone, but inside Inception-V3 their
# 12 channel panels per task re-read the input block twice as often as 3 x 32's 6, and
# they ran 0.15-0.3 ms slower per conv than the implicit GEMM where 3 x 32 ran faster.
SHORT_LIST = (DirectConfig(3, 32, 64, 192, 128), DirectConfig(4, 24, 64, 192, 256),
              DirectConfig(3, 32, 64, 96, 128))

# Channels-last (ConvNHWC): KC = 0 sums each micro-tile's whole K in registers
# (`_registers_last`); KC > 0 cuts the runs into K blocks of KC values accumulated in
# cbuf (`_accumulate_last`: the weights chunk stays in L1 across micro-tiles, for big K
# on small maps). MC blocks the positions whose input stays cached while the panels go
# by. The tuner's first configs: kernels alone, cold weights, on ResNet-50's convs the
# winners were 3 x 32 on 3x3 convs and small maps, 5 x 16 and 6 x 16 on 1x1 convs over
# 56x56 maps.
LAST_SPACE = tuple(DirectConfig(mr, nr, mc, nc, kc) for (mr, nr), mc, nc, kc in
                   itertools.product(MICRO_SHAPES, (64, 256), (96, 192, 384), (0, 512)))
LAST_SHORT_LIST = (DirectConfig(3, 32, 64, 192, 0), DirectConfig(3, 32, 64, 96, 0),
                   DirectConfig(6, 16, 64, 192, 0), DirectConfig(5, 16, 64, 96, 0),
                   DirectConfig(3, 32, 64, 192, 512), DirectConfig(6, 16, 64, 192, 512),
                   DirectConfig(4, 24, 64, 192, 0))

DIRECT_SPACE = tuple(DirectConfig(mr, nr, 64, nc, kc) for (mr, nr), nc, kc in
                     itertools.product(MICRO_SHAPES, (96, 192, 384), (128, 256)))


def prepack_weights(geo: ConvGeometry, cfg: DirectConfig, w: np.ndarray) -> np.ndarray:
    """W [OC, C/G, KH, KW] (OHWI [OC, KH, KW, C/G] for channels-last geometry, k in
    (kh, kw, ci) order then) as [G, panels, C/G*KH*KW, NR]: panel p of group g holds the
    group's output channels p*NR .. p*NR + NR-1 as columns (k in (ci, kh, kw) order),
    the last panel zero-padded."""
    nr, m, k = cfg.nr, geo.ocg, geo.icg * geo.taps
    panels = -(-max(m, 1) // nr)
    mat = np.zeros((geo.groups, panels * nr, k), np.asarray(w).dtype)
    mat[:, :m] = np.asarray(w).reshape(geo.groups, m, k)
    return np.ascontiguousarray(mat.reshape(geo.groups, panels, nr, k).transpose(0, 1, 3, 2))


def build_direct(geo: ConvGeometry, cfg: DirectConfig, dt: str, name: str, cores: int,
                 prepacked: bool = False) -> Function:
    """The kernel (see the module docstring); `prepacked`: the weights input arrives in
    the layout of `prepack_weights`, else it is [OC, C/G, KH, KW] and packed per call."""
    if dt != "float32":
        raise ValueError(f"the direct convolution is f32 only, got {dt}")
    m, n, k = geo.oh * geo.ow, geo.ocg, geo.icg * geo.taps
    bl = blocking(cfg.gemm(), m, n, k, geo.n * geo.groups, cores, k_unit=geo.taps)
    panels = -(-max(n, 1) // bl.nr)
    kb = KernelBuilder(name, "cpu")
    last = geo.channels_last
    x = kb.buffer("x", dt, (geo.n, geo.h * geo.w, geo.c) if last
                  else (geo.n, geo.c, geo.h * geo.w))
    w_shape = (geo.groups, panels, max(k, 1), bl.nr) if prepacked else (geo.oc, max(k, 1))
    w = kb.buffer("w", dt, w_shape)
    bias = kb.buffer("bias", dt, (geo.oc,)) if geo.has_bias else None
    out = kb.buffer("out", dt, (geo.n, m, geo.oc) if last else (geo.n, geo.oc, m))
    if geo.n * geo.oc * m == 0:
        return kb.finish()
    wt = w if prepacked else _pack_weights(kb, geo, bl, w, panels)
    src, wp = _source(kb, geo, x)
    tiles = (geo.n, geo.groups, bl.m_tiles, bl.n_tiles)
    with kb.for_range(tiles[0] * tiles[1] * tiles[2] * tiles[3], kind="parallel",
                      name="p") as p:
        with kb.for_mapping(spatial(*tiles), p, names=["b", "g", "ib", "jb"]) as (b, g, ib, jb):
            task = _Task(geo, bl, src, wp, wt, b, g, ib * bl.mt, jb * bl.nc)
            if geo.channels_last and cfg.kc == 0:
                _registers_last(kb, task, dt, out, bias)
            else:
                blocked = _accumulate_last if geo.channels_last else _accumulate
                _store(kb, task, blocked(kb, task, dt, cfg.kc), out, bias)
    return kb.finish()


@dataclass(frozen=True)
class _Task:
    """One task: image b, group g, positions p0 .. p0 + MT, output channels o0 .. o0 + NC
    of the group; src [N, C, HP*WP] is what the broadcasts read (row width wp)."""
    geo: ConvGeometry
    bl: Blocking
    src: Buffer
    wp: int
    wt: Buffer
    b: Expr
    g: Expr
    p0: Expr
    o0: Expr

    @property
    def rows(self) -> ExprLike:
        return tile_extent(self.bl.m, self.p0, self.bl.mt)

    @property
    def cols(self) -> ExprLike:
        return tile_extent(self.bl.n, self.o0, self.bl.nc)

    def channel(self, ci: ExprLike) -> ExprLike:
        """Input channel ci of the task's group."""
        return self.g * self.geo.icg + ci if self.geo.groups > 1 else ci

    def out_channel(self, j: ExprLike) -> ExprLike:
        """Output channel of the task's column j."""
        return self.g * self.geo.ocg + self.o0 + j if self.geo.groups > 1 else self.o0 + j

    def row_offsets(self, kb: KernelBuilder, r0: ExprLike) -> list[Var]:
        """Per micro-tile row r, the source offset of position p0 + r0 + r (clamped to
        the last position) under tap (0, 0)."""
        sh, sw = self.geo.strides
        offs = []
        for r in range(self.bl.mr):
            pos = minimum(self.p0 + r0 + r, self.bl.m - 1)
            offs.append(kb.declare("off", "int32", (pos // self.geo.ow) * (sh * self.wp)
                                   + (pos % self.geo.ow) * sw))
        return offs

    def by_panel_width(self, kb: KernelBuilder, jp: Expr, run: Callable[[int], None]) -> None:
        """run(NR) for panel jp, or run(8) when the panel is a ragged last one of at
        most 8 channels (only emitted when the columns allow one)."""
        if not may_have_narrow_tail(self.cols, self.bl.nr):
            run(self.bl.nr)
            return
        with kb.if_then(self.cols - jp * self.bl.nr <= LANES):
            run(LANES)
        with kb.otherwise():
            run(self.bl.nr)

    def load(self, position: ExprLike, channel: ExprLike) -> Expr:
        """The source element of `channel` at (padded) `position`."""
        if self.geo.channels_last:
            return self.src[self.b, position, channel]
        return self.src[self.b, channel, position]

    def tap_offset(self, t: int) -> int:
        kh, kw = divmod(t, self.geo.kw)
        return kh * self.geo.dilations[0] * self.wp + kw * self.geo.dilations[1]


def _accumulate(kb: KernelBuilder, task: _Task, dt: str, kc: int = 0) -> Buffer:
    """cbuf[MT][NCW] = the task's positions x output channels over all K blocks."""
    bl, geo = task.bl, task.geo
    rows, cols = task.rows, task.cols
    cbuf = kb.alloc("cbuf", dt, (bl.mt, bl.ncw))
    sh, sw = geo.strides
    with kb.for_range(bl.k_blocks, name="kb") as kblk:
        c0 = kblk * (bl.kc // geo.taps)
        kcur = bl.kc if bl.k % bl.kc == 0 else minimum(bl.k - kblk * bl.kc, bl.kc)
        chans = kcur // geo.taps
        with kb.for_range(ceil_div(rows, bl.mc), name="ib") as ib:
            i1 = ib * bl.mc
            brows = rows if bl.mt == bl.mc else minimum(rows - i1, bl.mc)
            with kb.for_range(ceil_div(cols, bl.nr), name="jp") as jp, \
                    kb.for_range(ceil_div(brows, bl.mr), name="ip") as ip:
                r0 = i1 + ip * bl.mr
                offs = task.row_offsets(kb, r0)
                panel = task.o0 // bl.nr + jp

                def av(r, ci, t, offs=offs, c0=c0):
                    return task.load(offs[r] + task.tap_offset(t), task.channel(c0 + ci))

                def bv(ci, t, j, c0=c0, panel=panel):
                    return task.wt[task.g, panel, (c0 + ci) * geo.taps + t, j]

                def run(nr: int, av=av, bv=bv, r0=r0, jp=jp) -> None:
                    acc = avx2.micro_kernel_taps(kb, bl.mr, nr, chans, geo.taps, av, bv)
                    avx2.accumulate_tile(kb, acc, (r0, jp * bl.nr), kblk, cbuf)
                task.by_panel_width(kb, jp, run)
    return cbuf


def _accumulate_last(kb: KernelBuilder, task: _Task, dt: str, kc: int) -> Buffer:
    """Channels-last with K blocks (config KC > 0): each contiguous run (`_runs`) cut
    into chunks of at most KC values; per chunk, every micro-tile of the task sums it in
    registers and adds it into cbuf[MT][NCW] (the NCHW direct kernel's blocking), so a
    chunk of the weights panel (KC x NR) stays in L1 across the micro-tiles instead of
    the whole panel streaming from L2 for each of them."""
    bl, geo = task.bl, task.geo
    rows, cols = task.rows, task.cols
    cbuf = kb.alloc("cbuf", dt, (bl.mt, bl.ncw))
    runs = _runs(geo)
    length = runs[0][1]
    step = runs[1][0] - runs[0][0] if len(runs) > 1 else 1
    chunk = max(1, min(kc, length))
    per_run = -(-length // chunk)
    with kb.for_range(len(runs) * per_run, name="kb") as kblk:
        run, q = (kblk // per_run, kblk % per_run) if per_run > 1 else (kblk, 0)
        t0 = run * step
        first = kb.declare("first", "int32", t0 * geo.icg + q * chunk)   # weights row
        toff = kb.declare("toff", "int32", (t0 // geo.kw) * (geo.dilations[0] * task.wp)
                          + (t0 % geo.kw) * geo.dilations[1])
        c0 = q * chunk
        count = chunk if length % chunk == 0 else minimum(length - c0, chunk)
        with kb.for_range(ceil_div(rows, bl.mc), name="ib") as ib:
            i1 = ib * bl.mc
            brows = rows if bl.mt == bl.mc else minimum(rows - i1, bl.mc)
            with kb.for_range(ceil_div(cols, bl.nr), name="jp") as jp, \
                    kb.for_range(ceil_div(brows, bl.mr), name="ip") as ip:
                r0 = i1 + ip * bl.mr
                offs = task.row_offsets(kb, r0)
                panel = task.o0 // bl.nr + jp

                def av(r, ci, offs=offs, c0=c0, toff=toff):
                    return task.load(offs[r] + toff, task.channel(c0 + ci))

                def bv(ci, j, panel=panel, first=first):
                    return task.wt[task.g, panel, first + ci, j]

                def run_tile(nr: int, av=av, bv=bv, r0=r0, jp=jp) -> None:
                    acc = avx2.micro_kernel(kb, bl.mr, nr, count, av, bv)
                    avx2.accumulate_tile(kb, acc, (r0, jp * bl.nr), kblk, cbuf)
                task.by_panel_width(kb, jp, run_tile)
    return cbuf


def _registers_last(kb: KernelBuilder, task: _Task, dt: str, out: Buffer,
                    bias: Buffer | None) -> None:
    """A channels-last task: per block of MC positions, per NR-channel panel, per
    micro-tile of MR positions, the whole K (every tap, each a run of C/G contiguous
    channels: the GEMM's loop with A read in place, one pointer per row) summed in
    registers, then stored through an MR x NR tile buffer (bias added; the store the
    epilogues graft onto runs along contiguous output channels)."""
    bl = task.bl
    rows, cols = task.rows, task.cols
    tile = kb.alloc("tile", dt, (bl.mr, bl.nr))
    with kb.for_range(ceil_div(rows, bl.mc), name="ib") as ib:
        i1 = ib * bl.mc
        brows = rows if bl.mt == bl.mc else minimum(rows - i1, bl.mc)
        with kb.for_range(ceil_div(cols, bl.nr), name="jp") as jp, \
                kb.for_range(ceil_div(brows, bl.mr), name="ip") as ip:
            r0 = i1 + ip * bl.mr
            _micro_tile_last(kb, task, r0, jp, tile)
            with kb.for_range(minimum(rows - r0, bl.mr), name="r") as r, \
                    kb.for_range(minimum(cols - jp * bl.nr, bl.nr), name="j") as j:
                oc = task.out_channel(jp * bl.nr + j)
                value = tile[r, j] + bias[oc] if bias is not None else tile[r, j]
                kb.store(out, (task.b, task.p0 + r0 + r, oc), value)


def _micro_tile_last(kb: KernelBuilder, task: _Task, r0: Expr, jp: Expr, tile: Buffer) -> None:
    """tile[r][j] = the sum over every tap and channel for position p0 + r0 + r and
    the panel's channel j (a narrow panel of at most 8 channels fills columns 0..7)."""
    bl, geo = task.bl, task.geo
    offs = task.row_offsets(kb, r0)
    panel = task.o0 // bl.nr + jp

    def run(nr: int) -> None:
        sets = avx2.accumulator_sets(kb, bl.mr, nr)
        for t, length in _runs(geo):
            toff = task.tap_offset(t)
            avx2.k_loop(kb, sets, length,
                        lambda r, ci, toff=toff: task.load(offs[r] + toff, task.channel(ci)),
                        lambda ci, j, t=t: task.wt[task.g, panel, t * geo.icg + ci, j])
        for r, row in enumerate(avx2.merged(kb, sets)):
            for v, x in enumerate(row):
                kb.evaluate(avx2.vcall("_mm256_storeu_ps", tile[r, v * LANES], x, dtype="void"))
    task.by_panel_width(kb, jp, run)


def _runs(geo: ConvGeometry) -> list[tuple[int, int]]:
    """The channels-last K as contiguous runs (first tap, length): per tap its C/G
    channels; or, with one group and no horizontal dilation, per kernel row its KW taps
    at once -- KW*C values side by side in the input (and in the OHWI weights), so the
    RGB stem's 7x7 taps of 3 channels are 7 runs of 21, not 49 of 3."""
    if geo.groups == 1 and geo.dilations[1] == 1:
        return [(kh * geo.kw, geo.kw * geo.icg) for kh in range(geo.kh)]
    return [(t, geo.icg) for t in range(geo.taps)]


def _store(kb: KernelBuilder, task: _Task, cbuf: Buffer, out: Buffer,
           bias: Buffer | None) -> None:
    """out[b, channel, p0 + r] = cbuf[r][j] (+ bias): per output channel, its run of
    positions (contiguous in the output)."""
    rows = task.rows
    if task.geo.channels_last:     # rows of contiguous output channels
        with kb.for_range(rows, name="r") as r, kb.for_range(task.cols, name="j") as j:
            oc = task.out_channel(j)
            value = cbuf[r, j] + bias[oc] if bias is not None else cbuf[r, j]
            kb.store(out, (task.b, task.p0 + r, oc), value)
        return
    with kb.for_range(ceil_div(rows, STORE_ROWS), name="rb") as rb, \
            kb.for_range(task.cols, name="j") as j, \
            kb.for_range(tile_extent(rows, rb * STORE_ROWS, STORE_ROWS), name="r") as r:
        oc = task.out_channel(j)
        pos = rb * STORE_ROWS + r
        value = cbuf[pos, j]
        if bias is not None:
            value = value + bias[oc]
        kb.store(out, (task.b, oc, task.p0 + pos), value)


STORE_ROWS = 16   # cbuf rows transposed out at a time (16 x NCW floats stay in L1)


def _pack_weights(kb: KernelBuilder, geo: ConvGeometry, bl: Blocking, w: Buffer,
                  panels: int) -> Buffer:
    """`prepack_weights` at run time (weights that are not a constant), in parallel
    over (group, panel); the channels past OC/G of the last panel are zeros."""
    k = max(geo.icg * geo.taps, 1)
    wt = kb.alloc("wpack", w.dtype, (geo.groups, panels, k, bl.nr))
    with kb.for_range(geo.groups * panels, kind="parallel", name="pw") as pw:
        with kb.for_mapping(spatial(geo.groups, panels), pw, names=["g", "jp"]) as (g, jp):
            with kb.for_range(k, name="k") as kk, kb.for_range(bl.nr, name="j") as j:
                oc = jp * bl.nr + j
                value = w[g * geo.ocg + minimum(oc, geo.ocg - 1), kk]
                if panels * bl.nr > geo.ocg:
                    value = select(oc < geo.ocg, value, Const(0.0, w.dtype))
                kb.store(wt, (g, jp, kk, j), value)
    return wt


def _padded_extent(out: int, stride: int, dilation: int, kernel: int) -> int:
    """Rows (or columns) of input the taps of `out` outputs cover, from the first pad."""
    return (out - 1) * stride + (kernel - 1) * dilation + 1


def _source(kb: KernelBuilder, geo: ConvGeometry, x: Buffer) -> tuple[Buffer, int]:
    """(buffer, row width) the broadcasts read: x itself when no tap reaches outside
    the image, else a zero-padded copy [N, C, HP*WP] filled in parallel over (n, c)."""
    hp = _padded_extent(geo.oh, geo.strides[0], geo.dilations[0], geo.kh)
    wp = _padded_extent(geo.ow, geo.strides[1], geo.dilations[1], geo.kw)
    ph, pw = geo.pads
    if (ph, pw) == (0, 0) and hp <= geo.h and wp <= geo.w:
        return x, geo.w
    if geo.channels_last:
        return _padded_last(kb, geo, x, hp, wp), wp
    xp = kb.alloc("xpad", x.dtype, (geo.n, geo.c, hp * wp))
    zero = Const(0.0, x.dtype)
    y_lo, y_hi = min(ph, hp), min(hp, ph + geo.h)
    x_lo, x_hi = min(pw, wp), min(wp, pw + geo.w)
    with kb.for_range(geo.n * geo.c, kind="parallel", name="nc") as nc:
        with kb.for_mapping(spatial(geo.n, geo.c), nc, names=["b", "c"]) as (b, c):
            with kb.for_range(y_lo * wp, name="z") as z:
                kb.store(xp, (b, c, z), zero)
            with kb.for_range(y_hi - y_lo, name="y") as y:
                row = (y_lo + y) * wp
                with kb.for_range(x_lo, name="z") as z:
                    kb.store(xp, (b, c, row + z), zero)
                with kb.for_range(x_hi - x_lo, name="ix") as ix:
                    kb.store(xp, (b, c, row + x_lo + ix),
                             x[b, c, (y_lo + y - ph) * geo.w + x_lo + ix - pw])
                with kb.for_range(wp - x_hi, name="z") as z:
                    kb.store(xp, (b, c, row + x_hi + z), zero)
            with kb.for_range((hp - y_hi) * wp, name="z") as z:
                kb.store(xp, (b, c, y_hi * wp + z), zero)
    return xp, wp


def _padded_last(kb: KernelBuilder, geo: ConvGeometry, x: Buffer, hp: int, wp: int) -> Buffer:
    """The zero-padded copy [N, HP*WP, C] of a channels-last input, in parallel over
    (n, padded row): each row is zeros, or zeros, W*C contiguous values, zeros."""
    xp = kb.alloc("xpad", x.dtype, (geo.n, hp * wp, geo.c))
    ph, pw = geo.pads
    x_lo, x_hi = min(pw, wp), min(wp, pw + geo.w)
    with kb.for_range(geo.n * hp, kind="parallel", name="ny") as ny:
        with kb.for_mapping(spatial(geo.n, hp), ny, names=["b", "y"]) as (b, y):
            row = y * wp
            inside = logical_and(y >= ph, y < ph + geo.h)
            with kb.if_then(inside):
                _zero_run(kb, xp, b, row, x_lo, geo.c)
                src = (y - ph) * geo.w + x_lo - pw
                with kb.for_range(x_hi - x_lo, name="ix") as ix, \
                        kb.for_range(geo.c, name="ci") as ci:
                    kb.store(xp, (b, row + x_lo + ix, ci), x[b, src + ix, ci])
                _zero_run(kb, xp, b, row + x_hi, wp - x_hi, geo.c)
            with kb.otherwise():
                _zero_run(kb, xp, b, row, wp, geo.c)
    return xp


def _zero_run(kb: KernelBuilder, xp: Buffer, b: Expr, start: ExprLike, count: int,
              c: int) -> None:
    if count > 0:
        with kb.for_range(count, name="z") as z, kb.for_range(c, name="ci") as ci:
            kb.store(xp, (b, start + z, ci), Const(0.0, xp.dtype))
