"""CPU template for 2-D convolution (Conv: NCHW input, OIHW weights; ConvNHWC: NHWC
input, OHWI weights; groups, strides, pads incl. auto_pad, dilations, optional bias).

ConvNHWC (made by `choose_layout` for C/G >= 8 and for depthwise convs) has three
schedules: the channels-last direct convolution (`conv_direct`, `LAST_SPACE`: the whole
K summed in registers per micro-tile, or in K blocks), for stride-1 3x3, 5x5 and 1-D
(1x7, 7x1, 1x3, 3x1) convs also the Winograd convolution (`winograd`, `WinogradConfig`:
in the space and first in the short list where `winograd.supports`), and, for
depthwise convs, `depthwise_nhwc` (`DepthwiseNHWCConfig`). Conv (NCHW) has the three
below.

Three schedules: the depthwise one chosen by the task's group structure, the other two
by the config (both are in every f32 non-depthwise conv's space; the tuner picks):

- **Implicit GEMM** (every conv with more than one input channel per group): per image
  and group, out[OC/G, OH*OW] = W[OC/G, C/G*KH*KW] x im2col(X)[C/G*KH*KW, OH*OW], run
  by the blocked GEMM of `microkernel.py` over `spatial(N, G, m_tiles, n_tiles)`
  parallel tiles. A column tile is a whole number of output rows and a K block a whole
  number of input channels, so the im2col gather happens while packing B: for each
  channel, tap (kh, kw) and output row of the tile, the valid columns (known at build
  time per kw) are one strided copy of an input row and the padding columns are zero
  stores; an input row outside the image (known per tile row) is all zeros. A 1x1,
  stride-1, unpadded conv is a plain GEMM on the [C, H*W] view (no gather). With
  pack_a the weights are packed into MR-row panels once per call (a parallel loop
  before the tiles). Constant weights are packed once, when the model is compiled
  (`prepack_weights`; `build(..., prepacked=True)` reads them so, whatever pack_a
  says: the plan does this for every conv whose weights are a graph constant). The
  bias is added in the final store. Config: `GemmConfig` (the MatMul knobs); default
  `default_gemm` (5 x 16, A packed when OH*OW >= 256).
- **Direct convolution** (`DirectConfig`, f32): the same product transposed, output
  positions x output channels, the input broadcast in place (or from a zero-padded
  copy) with the taps unrolled: no im2col at all. See `conv_direct.py` (faster on
  small maps: the tuner's short list tries it first there).
- **Direct depthwise** (one input channel per group, more than one group): see
  `depthwise.py`. Config: `DepthwiseConfig(rows, fused)`.

Guarantees: correct for every config of the task's space on every shape; no load or
store out of bounds (padding taps are skipped or zero-filled, never clamped reads).
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import numpy as np

from hidetc.compute.task import Task
from hidetc.schedules.common.conv_geometry import ConvGeometry, conv_geometry, valid_range
from hidetc.schedules.cpu import conv_direct, depthwise_nhwc, winograd
from hidetc.schedules.cpu.conv_direct import DIRECT_SPACE, DirectConfig, build_direct
from hidetc.schedules.cpu.depthwise import DEPTHWISE_SPACE, DepthwiseConfig, build_depthwise
from hidetc.schedules.cpu.depthwise_nhwc import (
    DEPTHWISE_NHWC_SPACE,
    DepthwiseNHWCConfig,
    build_depthwise_nhwc,
)
from hidetc.schedules.cpu.microkernel import (
    MICRO_SHAPES,
    SHORT_LIST,
    GemmConfig,
    PackB,
    ceil_div,
    default_gemm,
    direct_a,
    emit_gemm_tile,
    gemm_space,
    pack_b_rows,
    packed_a,
    tile_extent,
)
from hidetc.schedules.cpu.task_shape import Blocking, blocking
from hidetc.schedules.cpu.winograd import WinogradConfig, build_winograd
from hidetc.schedules.template import CpuTarget, Target
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Const, Expr, ExprLike, Function, logical_and
from hidetc.tir.mapping import spatial

ConvConfig = Union[GemmConfig, DirectConfig, DepthwiseConfig, DepthwiseNHWCConfig,
                   WinogradConfig]
DIRECT_POSITIONS = 400   # output positions up to which the tuner tries direct configs


class ConvTemplate:
    name = "cpu.conv"

    def space(self, task: Task, target: CpuTarget) -> Sequence[ConvConfig]:
        geo, isa = conv_geometry(task), target.isa
        if depthwise_nhwc.supports(geo):
            return DEPTHWISE_NHWC_SPACE
        if geo.depthwise:
            return DEPTHWISE_SPACE
        if geo.channels_last:
            return conv_direct.last_space(geo, isa) + _winograd(task, geo,
                                                                  winograd.SPACE[isa])
        if task.outputs[0].dtype != "float32":
            return gemm_space(isa)
        default = self.default(task, target)
        space = GEMM_SPACE[isa] + DIRECT_SPACE[isa]
        return space if default in space else space + (default,)

    def short_list(self, task: Task, target: CpuTarget) -> Sequence[ConvConfig]:
        """Configs the tuner tries first after the default: the implicit GEMM's
        (`microkernel.SHORT_LIST`), and on maps of at most DIRECT_POSITIONS positions
        first the direct convolution's wide-panel configs (`conv_direct.SHORT_LIST`);
        channels-last: `conv_direct.last_short_list` (7-row tiles first on 7x7 maps),
        after `winograd.SHORT_LIST` where the Winograd convolution applies;
        depthwise: none (small spaces)."""
        geo, isa = conv_geometry(task), target.isa
        if geo.depthwise:
            return ()
        if geo.channels_last:
            return (_winograd(task, geo, winograd.SHORT_LIST[isa])
                    + conv_direct.last_short_list(geo, isa))
        if task.outputs[0].dtype == "float32" and geo.oh * geo.ow <= DIRECT_POSITIONS:
            return conv_direct.SHORT_LIST[isa] + SHORT_LIST[isa][:4]
        return SHORT_LIST[isa]

    def kernel_key(self, task: Task, config: ConvConfig, target: Target) -> object:
        """Equal for configs that build the same kernel (`search.candidates` measures
        one of them): channels-last direct configs by what they clamp to on this shape
        (`conv_direct.last_kernel_key`); the others are their own key."""
        geo = conv_geometry(task)
        if isinstance(config, WinogradConfig):
            return winograd.kernel_key(geo, config, target)
        if geo.channels_last and isinstance(config, DirectConfig) and not geo.depthwise:
            return conv_direct.last_kernel_key(geo, config, target)
        return config

    def default(self, task: Task, target: CpuTarget) -> ConvConfig:
        geo = conv_geometry(task)
        if depthwise_nhwc.supports(geo):
            return DepthwiseNHWCConfig()
        if geo.depthwise:
            return DepthwiseConfig()
        if geo.channels_last:
            return conv_direct.LAST_SHORT_LIST[target.isa][0]
        return default_gemm(geo.ocg, geo.oh * geo.ow, target.isa)

    def exact_config(self, task: Task, config: ConvConfig,
                     target: CpuTarget) -> Optional[ConvConfig]:
        """The config to fall back to when `config`'s order of operations is not the
        direct sum's (a Winograd convolution: its transforms trade accuracy for speed,
        see `winograd`): the default (a direct or GEMM convolution); None when `config`
        already sums in the direct order. What a compile whose verification misses the
        tolerance rebuilds the diverging kernels with (`hidetc.driver.recover`)."""
        if isinstance(config, WinogradConfig):
            return self.default(task, target)
        return None

    def build(self, task: Task, config: ConvConfig, name: str, target: CpuTarget,
              prepacked: bool = False) -> Function:
        """`prepacked`: the weights input arrives already in the packed-A layout of
        `prepack_weights` (constant weights packed at compile time), so the kernel
        neither packs them nor reads them in place, whatever config.pack_a says. The
        parallel loop's tasks are shaped for `target.cores`."""
        geo = conv_geometry(task)
        if depthwise_nhwc.supports(geo):
            if not isinstance(config, DepthwiseNHWCConfig):
                raise ValueError(f"channels-last depthwise conv needs a DepthwiseNHWCConfig, "
                                 f"got {config}")
            return build_depthwise_nhwc(geo, config, task.outputs[0].dtype, name, prepacked)
        if geo.depthwise:
            if not isinstance(config, DepthwiseConfig):
                raise ValueError(f"depthwise conv needs a DepthwiseConfig, got {config}")
            return build_depthwise(geo, config, task.outputs[0].dtype, name)
        if isinstance(config, WinogradConfig):
            return build_winograd(geo, config, task.outputs[0].dtype, name, target, prepacked)
        if isinstance(config, DirectConfig):
            return build_direct(geo, config, task.outputs[0].dtype, name, target, prepacked)
        if geo.channels_last:
            raise ValueError(f"ConvNHWC runs as a direct convolution, got {config}")
        if not isinstance(config, GemmConfig):
            raise ValueError(f"conv as implicit GEMM needs a GemmConfig, got {config}")
        return _build_gemm(geo, config, task.outputs[0].dtype, name, target, prepacked)


def can_prepack(task: Task, config: ConvConfig) -> bool:
    """Whether `prepack_weights` applies: an implicit-GEMM or direct conv (not
    depthwise), or a channels-last depthwise conv."""
    if isinstance(config, DepthwiseNHWCConfig):
        return depthwise_nhwc.supports(conv_geometry(task))
    if isinstance(config, WinogradConfig):
        return winograd.supports(conv_geometry(task))
    return isinstance(config, (GemmConfig, DirectConfig)) and not conv_geometry(task).depthwise


def prepack_tag(task: Task, config: GemmConfig | DirectConfig | DepthwiseNHWCConfig) -> str:
    """Names the packed layout (the plan's constant `<w>.packed_<tag>`): the layout of
    `prepack_weights` depends on nothing else. Implicit GEMM: MR-row panels of W (MR
    clamped to the output channels per group as `blocking` does); direct: NR-wide
    panels of W^T."""
    if isinstance(config, DepthwiseNHWCConfig):
        return "dw"
    if isinstance(config, WinogradConfig):
        return winograd.prepack_tag(config)
    if isinstance(config, DirectConfig):
        return f"t{config.nr}"
    return f"mr{_packed_mr(conv_geometry(task), config)}"


def _packed_mr(geo: ConvGeometry, config: GemmConfig) -> int:
    return max(1, min(config.mr, geo.ocg))


def prepack_weights(task: Task, config: GemmConfig | DirectConfig | DepthwiseNHWCConfig,
                    w: np.ndarray) -> np.ndarray:
    """Direct configs: `conv_direct.prepack_weights`. Implicit GEMM: the weights
    [OC, C/G, KH, KW] in the layout `packed_a` builds at run time:
    [G, panels, C/G*KH*KW, MR] with row min(panel*MR + r, OC/G - 1) at [g, panel, :, r]
    (MR as `blocking` clamps it: min(config.mr, OC/G)). Done once, when the model is
    compiled, for constant weights: the kernel then reads its A panels straight from
    the weights (`build(..., prepacked=True)`)."""
    geo = conv_geometry(task)
    if isinstance(config, DepthwiseNHWCConfig):
        return depthwise_nhwc.prepack_weights(geo, w)
    if isinstance(config, WinogradConfig):
        return winograd.prepack_weights(geo, config, w)
    if isinstance(config, DirectConfig):
        return conv_direct.prepack_weights(geo, config, w)
    m, k = geo.ocg, geo.icg * geo.taps
    mr = _packed_mr(geo, config)
    panels = -(-max(m, 1) // mr)
    grouped = np.asarray(w).reshape(geo.groups, m, k)
    rows = np.minimum(np.arange(panels * mr), max(m - 1, 0))
    packed = grouped[:, rows, :].reshape(geo.groups, panels, mr, k).transpose(0, 1, 3, 2)
    return np.ascontiguousarray(packed)


TEMPLATE = ConvTemplate()
# the implicit GEMM's configs with A and B packed (prepacked weights ignore pack_a, and
# the direct configs read the input in place where pack_b=False would)
GEMM_SPACE = {isa: tuple(c for c in gemm_space(isa) if c.pack_a and c.pack_b)
              for isa in MICRO_SHAPES}


def _winograd(task: Task, geo: ConvGeometry, configs: tuple) -> tuple:
    """`configs` where the Winograd convolution applies (f32 and `winograd.supports`:
    stride-1 3x3, 5x5, 1x7, 7x1, 1x3, 3x1 convs), else none."""
    return configs if task.outputs[0].dtype == "float32" and winograd.supports(geo) else ()


# implicit GEMM ---------------------------------------------------------------------------
def _build_gemm(geo: ConvGeometry, cfg: GemmConfig, dt: str, name: str,
                target: CpuTarget, prepacked: bool = False) -> Function:
    m, n, k = geo.ocg, geo.oh * geo.ow, geo.icg * geo.taps
    unit = None if geo.pointwise else geo.ow
    bl = blocking(cfg, m, n, k, geo.n * geo.groups, target, n_unit=unit, k_unit=geo.taps,
                  gather=not geo.pointwise)
    kb = KernelBuilder(name, "cpu")
    x_shape = (geo.n, geo.c, geo.h * geo.w) if geo.pointwise else (geo.n, geo.c, geo.h, geo.w)
    x = kb.buffer("x", dt, x_shape)
    if prepacked:
        panels = -(-max(m, 1) // bl.mr)
        wt = kb.buffer("w", dt, (geo.groups, panels, max(k, 1), bl.mr))
    else:
        wt = kb.buffer("w", dt, (geo.oc, k))
    bias = kb.buffer("bias", dt, (geo.oc,)) if geo.has_bias else None
    out = kb.buffer("out", dt, (geo.n, geo.oc, n))
    if geo.n * geo.oc * n == 0:
        return kb.finish()
    if prepacked:
        def a_of(g):
            return lambda panel, r, kk: wt[g, panel, kk, r]
    elif cfg.pack_a:
        a_of = packed_a(kb, bl, dt, geo.groups,
                        lambda g, row, kk: wt[_chan(geo, g, row, geo.ocg), kk])
    tiles = (geo.n, geo.groups, bl.m_tiles, bl.n_tiles)
    with kb.for_range(tiles[0] * tiles[1] * tiles[2] * tiles[3], kind="parallel",
                      name="p") as p:
        with kb.for_mapping(spatial(*tiles), p, names=["b", "g", "ib", "jb"]) as (b, g, ib, jb):
            i0, j0 = ib * bl.mt, jb * bl.nc
            o0 = g * geo.ocg + i0 if geo.groups > 1 else i0
            cols = tile_extent(n, j0, bl.nc)
            a_panel = a_of(g) if cfg.pack_a or prepacked else direct_a(
                bl, lambda row, kk, g=g: wt[_chan(geo, g, row, geo.ocg), kk])

            def store(r, j, v, b=b, o0=o0, j0=j0):
                value = v + bias[o0 + r] if bias is not None else v
                kb.store(out, (b, o0 + r, j0 + j), value)
            b_direct = None if not geo.pointwise else (
                lambda kk, c, b=b, g=g, j0=j0: x[b, _chan(geo, g, kk), j0 + c])
            emit_gemm_tile(kb, bl, dt, i0, (tile_extent(m, i0, bl.mt), cols), a_panel,
                           _b_packer(geo, bl, x, b, g, jb, cols), store, b_direct)
    return kb.finish()


def _b_packer(geo: ConvGeometry, bl: Blocking, x: Buffer, b: Expr, g: Expr, jb: Expr,
              cols: ExprLike) -> PackB:
    """pack_b of column tile `jb`: a row copy of X[b, channels, H*W] for pointwise
    convs, else the im2col gather of the tile's output rows."""
    if geo.pointwise:
        return pack_b_rows(lambda kk, col: x[b, _chan(geo, g, kk), col], jb * bl.nc, cols)
    rows_per_tile = bl.nc // geo.ow
    oy0 = jb * rows_per_tile
    return _im2col_pack(x, geo, b, g, oy0, tile_extent(geo.oh, oy0, rows_per_tile))


def _chan(geo: ConvGeometry, g: Expr, i: ExprLike, per_group: int | None = None) -> ExprLike:
    """Channel `i` of group `g` (input channels by default, else `per_group` wide)."""
    width = geo.icg if per_group is None else per_group
    return g * width + i if geo.groups > 1 else i


def _im2col_pack(x: Buffer, geo: ConvGeometry, b: Expr, g: Expr, oy0: Expr,
                 trows: ExprLike) -> PackB:
    """pack_b for im2col: bpack[ci*KH*KW + kh*KW + kw][t*OW + ox] =
    X[b, channel(c0 + ci), (oy0+t)*sh - ph + kh*dh, ox*sw - pw + kw*dw] or 0 outside."""
    sh, sw = geo.strides
    dh, dw = geo.dilations
    ph, pw = geo.pads

    def pack(kb: KernelBuilder, bpack: Buffer, k0: Expr, kcur: ExprLike,
             c_from: ExprLike) -> None:  # c_from is 0: the gather always packs it all
        c0 = k0 // geo.taps
        with kb.for_range(ceil_div(kcur, geo.taps), name="ci") as ci:
            ch = _chan(geo, g, c0 + ci)
            for kh in range(geo.kh):
                ylo, yhi = valid_range(geo.oh, geo.h, sh, ph, kh * dh)
                with kb.for_range(trows, name="t") as t:
                    oy = oy0 + t
                    iy = oy * sh + (kh * dh - ph)
                    base = ci * geo.taps + kh * geo.kw
                    if (ylo, yhi) == (0, geo.oh):
                        _gather_row(kb, bpack, x, geo, b, ch, iy, base, t)
                        continue
                    with kb.if_then(logical_and(oy >= ylo, oy < yhi)):
                        _gather_row(kb, bpack, x, geo, b, ch, iy, base, t)
                    with kb.otherwise():
                        for kw in range(geo.kw):
                            _fill(kb, bpack, base + kw, t * geo.ow, geo.ow)
    return pack


def _gather_row(kb: KernelBuilder, bpack: Buffer, x: Buffer, geo: ConvGeometry, b: Expr,
                ch: ExprLike, iy: Expr, base: Expr, t: Expr) -> None:
    """The KW packed rows of one output row `t` for input row `iy` (inside the image)."""
    sw, dw, pw = geo.strides[1], geo.dilations[1], geo.pads[1]
    col0 = t * geo.ow
    for kw in range(geo.kw):
        lo, hi = valid_range(geo.ow, geo.w, sw, pw, kw * dw)
        krow = base + kw
        if hi <= lo:
            _fill(kb, bpack, krow, col0, geo.ow)
            continue
        _fill(kb, bpack, krow, col0, lo)
        with kb.for_range(hi - lo, name="ox") as ox:
            ix = (ox + lo) * sw + (kw * dw - pw)
            kb.store(bpack, (krow, col0 + lo + ox), x[b, ch, iy, ix])
        _fill(kb, bpack, krow, col0 + hi, geo.ow - hi)


def _fill(kb: KernelBuilder, bpack: Buffer, krow: ExprLike, start: ExprLike,
          count: int) -> None:
    if count <= 0:
        return
    with kb.for_range(count, name="z") as z:
        kb.store(bpack, (krow, start + z), Const(0.0, bpack.dtype))
