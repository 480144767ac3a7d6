"""The direct convolution's channels-last forms (ConvNHWC; see `conv_direct.py` for
the schedule they share): X [N, H*W, C] (or its zero-padded copy [N, HP*WP, C],
`padded`), out [N, P, OC], OHWI weights packed into NR-channel panels with k in
(kh, kw, ci) order. The input element of position p under tap t for channel ci sits at
src[off(p) + tap(t)][ci], so per tap each of the MR rows walks one pointer along
contiguous channels: the GEMM micro-kernel with A read in place. With one group and no
horizontal dilation a kernel row's KW taps are one run of KW*C contiguous values
(`runs`).

- KC = 0 (`registers`): each micro-tile sums its whole K in registers (runs unrolled,
  one channel loop each), then goes out through an MR x NR tile buffer along
  contiguous output channels (vectorized, epilogues grafted on the store).
- KC > 0 (`accumulate` + `store`): the runs are cut into K blocks of at most KC values
  accumulated in cbuf, so a KC x NR chunk of the weights stays in L1 across the
  micro-tiles (big K on small maps).
"""
from __future__ import annotations

from hidetc.schedules.common.conv_geometry import ConvGeometry
from hidetc.schedules.cpu import avx2
from hidetc.schedules.cpu.direct_task import DirectTask
from hidetc.schedules.cpu.microkernel import ceil_div
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Const, Expr, ExprLike, eq, logical_and, minimum
from hidetc.tir.mapping import spatial


def accumulate(kb: KernelBuilder, task: DirectTask, dt: str, kc: int) -> Buffer:
    """Channels-last with K blocks (config KC > 0): each contiguous run (`runs`) cut
    into chunks of at most KC values; per chunk, every micro-tile of the task sums it in
    registers and adds it into cbuf[MT][NCW] (the NCHW direct kernel's blocking), so a
    chunk of the weights panel (KC x NR) stays in L1 across the micro-tiles instead of
    the whole panel streaming from L2 for each of them."""
    bl, geo = task.bl, task.geo
    cbuf = kb.alloc("cbuf", dt, (bl.mt, bl.ncw))
    pieces = runs(geo)
    length = pieces[0][1]
    step = pieces[1][0] - pieces[0][0] if len(pieces) > 1 else 1
    chunk = chunk_length(geo, kc)
    per_run = -(-length // chunk)
    blocks = len(pieces) * per_run

    def split(kblk: ExprLike) -> tuple[ExprLike, ExprLike]:   # (run, chunk in the run)
        return (kblk // per_run, kblk % per_run) if per_run > 1 else (kblk, 0)

    with kb.for_range(blocks, name="kb") as kblk:
        run, q = split(kblk)
        t0 = run * step
        first = kb.declare("first", "int32", t0 * geo.icg + q * chunk)   # weights row
        toff = kb.declare("toff", "int32", task.tap_offset(t0))
        c0 = q * chunk
        count = chunk if length % chunk == 0 else minimum(length - c0, chunk)
        run_n, q_n = split(minimum(kblk + 1, blocks - 1))
        first_n = kb.declare("first_n", "int32", run_n * step * geo.icg + q_n * chunk)
        with task.micro_tiles(kb) as (r0, jp, ip):
            offs = task.row_offsets(kb, r0)
            panel = task.o0 // bl.nr + jp
            # rows clamped: the next chunk may be a short last one
            ahead = avx2.ahead_of_panels(
                kb, ip, jp, ceil_div(task.cols, bl.nr), first, first_n,
                lambda k, p, j: task.wt[task.g, task.o0 // bl.nr + p,
                                        minimum(k, task.wt.shape[2] - 1), j])

            def av(r, ci, offs=offs, c0=c0, toff=toff):
                return task.load(offs[r] + toff, task.channel(c0 + ci))

            def bv(ci, j, panel=panel, first=first):
                return task.wt[task.g, panel, first + ci, j]

            def run_tile(nr: int, av=av, bv=bv, r0=r0, jp=jp, ahead=ahead) -> None:
                acc = avx2.micro_kernel(kb, bl.mr, nr, bl.lanes, count, av, bv, ahead)
                avx2.accumulate_tile(kb, acc, (r0, jp * bl.nr), kblk, cbuf)
            task.by_panel_width(kb, jp, run_tile)
    return cbuf


# The whole-K micro-tiles prefetch the next panel only when it is this small: a bigger
# one (a 3x3 conv's 4608 x 64 floats, 1.2 MB) evicts the current panel from L2 before
# the block's other micro-tiles have read it (measured: 3x3 convs 3-8% slower).
PREFETCH_PANEL_BYTES = 128 * 1024


def registers(kb: KernelBuilder, task: DirectTask, dt: str, out: Buffer,
              bias: Buffer | None) -> None:
    """A channels-last task: per block of MC positions, per NR-channel panel, per
    micro-tile of MR positions, the whole K (every tap, each a run of C/G contiguous
    channels: the GEMM's loop with A read in place, one pointer per row) summed in
    registers, then stored through an MR x NR tile buffer (bias added; the store the
    epilogues graft onto runs along contiguous output channels)."""
    bl = task.bl
    rows, cols = task.rows, task.cols
    tile = kb.alloc("tile", dt, (bl.mr, bl.nr))
    with task.micro_tiles(kb) as (r0, jp, ip):
        _micro_tile(kb, task, r0, jp, eq(ip, 0), tile)
        with kb.for_range(minimum(rows - r0, bl.mr), name="r") as r, \
                kb.for_range(minimum(cols - jp * bl.nr, bl.nr), name="j") as j:
            oc = task.out_channel(jp * bl.nr + j)
            value = tile[r, j] + bias[oc] if bias is not None else tile[r, j]
            kb.store(out, (task.b, task.p0 + r0 + r, oc), value)


def _micro_tile(kb: KernelBuilder, task: DirectTask, r0: Expr, jp: Expr, first: Expr,
                tile: Buffer) -> None:
    """tile[r][j] = the sum over every tap and channel for position p0 + r0 + r and
    the panel's channel j (a narrow panel of at most L channels, the target's lanes,
    fills columns 0..L-1); the `first` micro-tile over the panel prefetches the next panel."""
    bl, geo = task.bl, task.geo
    offs = task.row_offsets(kb, r0)
    panel = task.o0 // bl.nr + jp
    nxt = task.next_panel(jp)

    def run(nr: int) -> None:
        sets = avx2.accumulator_sets(kb, bl.mr, nr, bl.lanes)
        for t, length in runs(geo):
            toff = task.tap_offset(t)
            ahead = (avx2.Ahead(first, lambda ci, j, t=t: task.wt[task.g, nxt, t * geo.icg + ci, j])
                     if geo.icg * geo.taps * nr * 4 <= PREFETCH_PANEL_BYTES else None)
            avx2.k_loop(kb, sets, length,
                        lambda r, ci, toff=toff: task.load(offs[r] + toff, task.channel(ci)),
                        lambda ci, j, t=t: task.wt[task.g, panel, t * geo.icg + ci, j], ahead)
        for r, row in enumerate(avx2.merged(kb, sets)):
            for col, x in zip(avx2.offsets(nr, bl.lanes), row):
                avx2.store(kb, tile[r, col], x)
    task.by_panel_width(kb, jp, run)


def runs(geo: ConvGeometry) -> list[tuple[int, int]]:
    """The channels-last K as contiguous runs (first tap, length): per tap its C/G
    channels; or, with one group and no horizontal dilation, per kernel row its KW taps
    at once -- KW*C values side by side in the input (and in the OHWI weights), so the
    RGB stem's 7x7 taps of 3 channels are 7 runs of 21, not 49 of 3."""
    if geo.groups == 1 and geo.dilations[1] == 1:
        return [(kh * geo.kw, geo.kw * geo.icg) for kh in range(geo.kh)]
    return [(t, geo.icg) for t in range(geo.taps)]


def chunk_length(geo: ConvGeometry, kc: int) -> int:
    """Values per K chunk of config KC > 0: KC clamped to a run's length."""
    return max(1, min(kc, runs(geo)[0][1]))


def store(kb: KernelBuilder, task: DirectTask, cbuf: Buffer, out: Buffer,
          bias: Buffer | None) -> None:
    """out[b, p0 + r, channel] = cbuf[r][j] (+ bias): rows of contiguous channels."""
    with kb.for_range(task.rows, name="r") as r, kb.for_range(task.cols, name="j") as j:
        oc = task.out_channel(j)
        value = cbuf[r, j] + bias[oc] if bias is not None else cbuf[r, j]
        kb.store(out, (task.b, task.p0 + r, oc), value)


def padded(kb: KernelBuilder, geo: ConvGeometry, x: Buffer, hp: int, wp: int) -> Buffer:
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
