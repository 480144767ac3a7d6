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
accumulation are the GEMM's (`task_shape.blocking`, K blocks a whole number of
channels); the final store writes each output channel's run of positions (contiguous
in NCHW), adding the bias.

Where it is offered (measurements: bench/results/2026-12-01-direct-conv.md): it beats
the implicit GEMM on small maps and loses on large ones, and inside models only its
wide-panel configs (3 x 32, 4 x 24) keep what they win alone (the narrow ones re-read
the input block once per 16 output channels), so the tuner's short list tries those
first on maps of at most `conv.DIRECT_POSITIONS` positions, and the rest only in a
full-space tuning (level 2).

Channels-last (ConvNHWC, `geo.channels_last`): the same tasks and configs, the K
along contiguous channels; see `conv_direct_last.py` (KC = 0: the whole K of a
micro-tile in registers; KC > 0: K blocks in cbuf). Channels-last is the cpu layout
because it beat the NCHW kernels inside ResNet-50; the K-blocked form is for big K on
small maps; the NCHW loop on channels-last data (channels innermost under unrolled
taps) lost to the GEMM on 3x3 convs (bench/results/2026-12-01-nhwc-cpu.md).
The task view both share is `direct_task.DirectTask`.

Guarantees: correct for every config on every conv shape it is built for (not
depthwise: `conv.py` sends those to `depthwise.py`); positions past P are clamped to
the last one on load and never stored; output channels past OC/G read zero weights
from the padded last panel and are never stored; no load outside the input or its
padded copy. f32 only (the Conv template keeps other dtypes on the GEMM schedule).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from hidetc.schedules.common.conv_geometry import ConvGeometry
from hidetc.schedules.cpu import avx2, conv_direct_last
from hidetc.schedules.cpu.direct_task import DirectTask
from hidetc.schedules.cpu.microkernel import MICRO_SHAPES, GemmConfig, ceil_div, tile_extent
from hidetc.schedules.cpu.task_shape import Blocking, blocking
from hidetc.target import CpuTarget
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Buffer,
    Const,
    Function,
    minimum,
    select,
)
from hidetc.tir.mapping import spatial


@dataclass(frozen=True)
class DirectConfig:
    """Knobs of the direct convolution: micro-tile MR positions x NR output channels,
    MC positions per L2 block, NC output channels per task, KC = K block depth (NCHW:
    rounded down to whole input channels; channels-last: values of a contiguous run,
    0 = no K blocks, the whole K in registers)."""
    mr: int = 6
    nr: int = 16
    mc: int = 64
    nc: int = 192
    kc: int = 256

    def gemm(self) -> GemmConfig:
        return GemmConfig(self.mr, self.nr, self.mc, self.nc, self.kc, pack_a=False,
                          pack_b=False)


# The tuner's first direct configs on small maps (`ConvTemplate.short_list`): NR >= 24
# only. 5 x 16 and 6 x 16 won more sweeps of kernels alone, but inside a model their 12
# channel panels per task re-read the input block twice as often as 3 x 32's 6, and
# they ran slower than the implicit GEMM where 3 x 32 ran faster
# (bench/results/2026-12-06-decision-notes.md).
# (Each of these tables is per ISA name, `CpuTarget.isa`.)
SHORT_LIST = {"avx2": (DirectConfig(3, 32, 64, 192, 128), DirectConfig(4, 24, 64, 192, 256),
                       DirectConfig(3, 32, 64, 96, 128)),
              "avx512": (DirectConfig(8, 32, 64, 192, 128), DirectConfig(6, 48, 64, 192, 256),
                         DirectConfig(4, 64, 64, 96, 128))}

# Channels-last (ConvNHWC): KC = 0 sums each micro-tile's whole K in registers
# (`conv_direct_last.registers`); KC > 0 cuts the runs into K blocks of KC values
# accumulated in cbuf (`conv_direct_last.accumulate`: the weights chunk stays in L1
# across micro-tiles, for big K on small maps). MC blocks the positions whose input
# stays cached while the panels go by. The tuner's first configs: kernels alone, cold
# weights, on ResNet-50's convs the winners were 3 x 32 on 3x3 convs and small maps,
# 5 x 16 and 6 x 16 on 1x1 convs over 56x56 maps.
# AVX-512's panels are two or more cache lines wide (NR >= 32), so a KC x NR chunk that
# stays in L1 (48 KiB on Sapphire Rapids) is 128-256 values deep, not AVX2's 512. Its
# short list is a greedy cover of a sweep of 72 configs (MC 64) over ResNet-50's 23
# distinct convs, kernels alone on a 2-core Sapphire Rapids, equal kernels merged
# (`last_kernel_key`): the 8 lose 1.3% against each conv's best (the old list 6.7%);
# K chunks won on most 3x3 convs and on big K over 14x14 and 7x7 maps.
LAST_KC = {"avx2": (0, 512), "avx512": (0, 128, 256, 512)}
LAST_SPACE = {isa: tuple(DirectConfig(mr, nr, mc, nc, kc) for (mr, nr), mc, nc, kc in
                         itertools.product(shapes, (64, 256), (96, 192, 384), LAST_KC[isa]))
              for isa, shapes in MICRO_SHAPES.items()}
LAST_SHORT_LIST = {
    "avx2": (DirectConfig(3, 32, 64, 192, 0), DirectConfig(3, 32, 64, 96, 0),
             DirectConfig(6, 16, 64, 192, 0), DirectConfig(5, 16, 64, 96, 0),
             DirectConfig(3, 32, 64, 192, 512), DirectConfig(6, 16, 64, 192, 512),
             DirectConfig(4, 24, 64, 192, 0)),
    "avx512": (DirectConfig(8, 32, 64, 192, 0), DirectConfig(4, 64, 64, 192, 128),
               DirectConfig(8, 48, 64, 384, 256), DirectConfig(8, 32, 64, 384, 256),
               DirectConfig(4, 64, 64, 96, 128), DirectConfig(8, 32, 64, 96, 512),
               DirectConfig(4, 64, 64, 96, 0), DirectConfig(8, 32, 64, 192, 128))}

# AVX-512, maps where 8-row tiles pad more than 5% of the positions and 7 divides them
# (7x7: 56 rows computed for 49): 7 x 48 tiles too (21 accumulators, no padded rows).
# In ResNet-50 and MobileNet-V2 (each launch timed in the model, paired with the
# previous artifact) they ran 3-30% faster on the 7x7 convs; on 14x14 maps (2% padded)
# the tuner picked them from kernels timed alone and they ran 7-25% slower in the
# model, so they are offered only where the padding is large (`rows_of_7`).
ROWS_OF_7 = {"avx2": (),
             "avx512": (DirectConfig(7, 48, 64, 192, 128), DirectConfig(7, 48, 64, 192, 0),
                        DirectConfig(7, 48, 64, 96, 256))}
ROW7_SPACE = {isa: tuple(DirectConfig(7, 48, mc, nc, kc) for mc, nc, kc in
                         itertools.product((64, 256), (96, 192, 384), LAST_KC[isa]))
              if ROWS_OF_7[isa] else () for isa in MICRO_SHAPES}


def rows_of_7(geo: ConvGeometry, isa: str) -> bool:
    """Whether this channels-last conv gets the 7-row tiles (see ROWS_OF_7)."""
    positions = geo.oh * geo.ow
    return bool(ROWS_OF_7[isa]) and positions % 7 == 0 and -positions % 8 > 0.05 * positions


def last_space(geo: ConvGeometry, isa: str) -> tuple[DirectConfig, ...]:
    """The channels-last space for this conv: `LAST_SPACE`, and `ROW7_SPACE` where
    `rows_of_7`."""
    return LAST_SPACE[isa] + ROW7_SPACE[isa] if rows_of_7(geo, isa) else LAST_SPACE[isa]


def last_short_list(geo: ConvGeometry, isa: str) -> tuple[DirectConfig, ...]:
    """The channels-last short list for this conv: `LAST_SHORT_LIST`, or where
    `rows_of_7`, `ROWS_OF_7` then the list's first five."""
    if rows_of_7(geo, isa):
        return ROWS_OF_7[isa] + LAST_SHORT_LIST[isa][:5]
    return LAST_SHORT_LIST[isa]


DIRECT_SPACE = {isa: tuple(DirectConfig(mr, nr, 64, nc, kc) for (mr, nr), nc, kc in
                           itertools.product(shapes, (96, 192, 384), (128, 256)))
                for isa, shapes in MICRO_SHAPES.items()}


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


def last_kernel_key(geo: ConvGeometry, cfg: DirectConfig, target: CpuTarget) -> tuple:
    """What a channels-last config's kernel depends on: its blocking on this shape
    (tiles clamped to the problem; the GEMM's K block is unused here) and the K chunk
    (0: the whole K in registers; else KC clamped to a run's length)."""
    chunk = 0 if cfg.kc == 0 else conv_direct_last.chunk_length(geo, cfg.kc)
    return replace(blocking_for(geo, cfg, target), kc=0), chunk


def blocking_for(geo: ConvGeometry, cfg: DirectConfig, target: CpuTarget) -> Blocking:
    """The config clamped to the conv: per image and group, P positions x OC/G output
    channels x C/G*KH*KW (K blocks of whole input channels)."""
    return blocking(cfg.gemm(), geo.oh * geo.ow, geo.ocg, geo.icg * geo.taps,
                    geo.n * geo.groups, target, k_unit=geo.taps,
                    local_rows=geo.n * geo.groups == 1)


def build_direct(geo: ConvGeometry, cfg: DirectConfig, dt: str, name: str,
                 target: CpuTarget, prepacked: bool = False) -> Function:
    """The kernel (see the module docstring); `prepacked`: the weights input arrives in
    the layout of `prepack_weights`, else it is [OC, C/G, KH, KW] and packed per call."""
    if dt != "float32":
        raise ValueError(f"the direct convolution is f32 only, got {dt}")
    bl = blocking_for(geo, cfg, target)
    m, n, k = bl.m, bl.n, bl.k
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
            task = DirectTask(geo, bl, src, wp, wt, b, g, ib * bl.mt, jb * bl.nc)
            if geo.channels_last and cfg.kc == 0:
                conv_direct_last.registers(kb, task, dt, out, bias)
            elif geo.channels_last:
                conv_direct_last.store(kb, task, conv_direct_last.accumulate(kb, task, dt, cfg.kc),
                                       out, bias)
            else:
                _store(kb, task, _accumulate(kb, task, dt), out, bias)
    return kb.finish()


def _accumulate(kb: KernelBuilder, task: DirectTask, dt: str) -> Buffer:
    """cbuf[MT][NCW] = the task's positions x output channels over all K blocks."""
    bl, geo = task.bl, task.geo
    cbuf = kb.alloc("cbuf", dt, (bl.mt, bl.ncw))
    with kb.for_range(bl.k_blocks, name="kb") as kblk:
        c0 = kblk * (bl.kc // geo.taps)
        kcur = bl.kc if bl.k % bl.kc == 0 else minimum(bl.k - kblk * bl.kc, bl.kc)
        chans = kcur // geo.taps
        with task.micro_tiles(kb) as (r0, jp, _):
            offs = task.row_offsets(kb, r0)
            panel = task.o0 // bl.nr + jp

            def av(r, ci, t, offs=offs, c0=c0):
                return task.load(offs[r] + task.tap_offset(t), task.channel(c0 + ci))

            def bv(ci, t, j, c0=c0, panel=panel):
                return task.wt[task.g, panel, (c0 + ci) * geo.taps + t, j]

            def run(nr: int, av=av, bv=bv, r0=r0, jp=jp) -> None:
                acc = avx2.micro_kernel_taps(kb, bl.mr, nr, bl.lanes, chans, geo.taps, av, bv)
                avx2.accumulate_tile(kb, acc, (r0, jp * bl.nr), kblk, cbuf)
            task.by_panel_width(kb, jp, run)
    return cbuf


def _store(kb: KernelBuilder, task: DirectTask, cbuf: Buffer, out: Buffer,
           bias: Buffer | None) -> None:
    """out[b, channel, p0 + r] = cbuf[r][j] (+ bias): per output channel, its run of
    positions (contiguous in the output)."""
    rows = task.rows
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
        return conv_direct_last.padded(kb, geo, x, hp, wp), wp
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
