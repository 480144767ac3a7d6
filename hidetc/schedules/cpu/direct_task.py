"""The task view the direct convolution's kernels share (`conv_direct.py` for NCHW,
`conv_direct_last.py` for channels-last): one parallel task's image, group, positions
and output channels, and how its micro-tiles address the source and the packed
weights."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from hidetc.schedules.common.conv_geometry import ConvGeometry
from hidetc.schedules.cpu.microkernel import ceil_div, may_have_narrow_tail, tile_extent
from hidetc.schedules.cpu.task_shape import Blocking
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Expr, ExprLike, Var, minimum


@dataclass(frozen=True)
class DirectTask:
    """One task: image b, group g, positions p0 .. p0 + MT, output channels o0 .. o0 + NC
    of the group; src [N, C, HP*WP] (channels-last: [N, HP*WP, C]) is what the
    broadcasts read (row width wp)."""
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

    @contextmanager
    def micro_tiles(self, kb: KernelBuilder) -> Iterator[tuple[Expr, Expr, Expr]]:
        """Loops over the task's micro-tiles -- per block of MC positions, per NR-channel
        panel jp, per MR positions from r0 -- yielding (r0, jp, ip) inside them (ip == 0:
        the block's first micro-tile over panel jp)."""
        bl = self.bl
        with kb.for_range(ceil_div(self.rows, bl.mc), name="ib") as ib:
            i1 = ib * bl.mc
            brows = self.rows if bl.mt == bl.mc else minimum(self.rows - i1, bl.mc)
            with kb.for_range(ceil_div(self.cols, bl.nr), name="jp") as jp, \
                    kb.for_range(ceil_div(brows, bl.mr), name="ip") as ip:
                yield i1 + ip * bl.mr, jp, ip

    def next_panel(self, jp: ExprLike) -> Expr:
        """The packed-weights panel after this task's panel jp (the last one stays)."""
        return minimum(self.o0 // self.bl.nr + jp + 1, self.wt.shape[1] - 1)

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
        """run(NR) for panel jp, or run(L) when the panel is a ragged last one of at most
        L channels (the target's vector lanes; only emitted when the columns allow one)."""
        if not may_have_narrow_tail(self.cols, self.bl.nr, self.bl.lanes):
            run(self.bl.nr)
            return
        with kb.if_then(self.cols - jp * self.bl.nr <= self.bl.lanes):
            run(self.bl.lanes)
        with kb.otherwise():
            run(self.bl.nr)

    def load(self, position: ExprLike, channel: ExprLike) -> Expr:
        """The source element of `channel` at (padded) `position`."""
        if self.geo.channels_last:
            return self.src[self.b, position, channel]
        return self.src[self.b, channel, position]

    def tap_offset(self, t: ExprLike) -> ExprLike:
        """Source offset of tap t = kh * KW + kw from tap (0, 0) (t may be a run-time
        expression)."""
        kh, kw = t // self.geo.kw, t % self.geo.kw
        return kh * (self.geo.dilations[0] * self.wp) + kw * self.geo.dilations[1]
