"""CPU template for a 2-D convolution of one group computed in bf16 (`compute="bfloat16"`,
`hidetc.graph.passes.compute_bf16`): Conv (NCHW, OIHW weights) and ConvNHWC (NHWC, OHWI
weights), f32 tensors, the products' operands rounded to bf16 and summed in f32.

An implicit GEMM over every output position of the batch at once: out[pos][oc] =
im2col(X)[pos][k] x W^T[k][oc], M = N*OH*OW, N = OC, K = KH*KW*C, with k in the weights'
own order ((kh*KW + kw)*C + c for OHWI, (c*KH + kh)*KW + kw for OIHW), so the weights
are W.reshape(OC, K)^T: packed once at compile time (`prepack_weights`, the bf16 pair
panels of `gemm_bf16.pack_weights`, half the f32 bytes) when constant. The im2col gather
is the A packing (`_gather`: each task's own rows where a task has all the columns, so
the im2col block stays in the core's caches; else once before the tasks): per output
position, NHWC with C a multiple of 32, 16 or 8 copies each
K chunk of that width (channels of one tap, contiguous on both sides; zeros for a tap
in the padding); otherwise (and NCHW) per tap, one run of C channels (NHWC) or one
element per channel (NCHW), zero for taps in the padding (indices clamped, so no load
leaves the image); positions past M repeat the last one. Then `gemm_bf16`'s tasks; the
bias is added in the store (the epilogue after it).

Guarantees: the reference's result (`hidetc.graph.ops.conv`, with the operands rounded)
up to the order of the f32 additions, for any geometry of one group (strides, pads,
dilations, symbolic batch). Assumes f32 tensors on a target with AVX512_BF16.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hidetc.compute.task import Task
from hidetc.schedules.common.conv_geometry import ConvGeometry, conv_geometry
from hidetc.schedules.cpu.gemm_bf16 import (
    BF16,
    K_STEP,
    Bf16Config,
    Problem,
    a_at,
    bf16_space,
    default_bf16,
    emit_bf16_gemm,
    pack_weights,
    packed_shape,
)
from hidetc.schedules.template import CpuTarget
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Buffer,
    Const,
    Expr,
    ExprLike,
    Function,
    as_expr,
    cast,
    logical_and,
    maximum,
    minimum,
    select,
)


class ConvBf16Template:
    name = "cpu.conv.bf16"
    precisions = ("bf16",)     # the catalog's rows (`hidetc inspect --space`)

    def space(self, task: Task, target: CpuTarget) -> Sequence[Bf16Config]:
        return bf16_space()

    def serves(self, task: Task) -> bool:
        """One group only (`compute_bf16` marks no other)."""
        return conv_geometry(task).groups == 1

    def short_list(self, task: Task, target: CpuTarget) -> Sequence[Bf16Config]:
        return (Bf16Config(128, 256), Bf16Config(64, 64), Bf16Config(256, 128))

    def default(self, task: Task, target: CpuTarget) -> Bf16Config:
        geo = conv_geometry(task.hinted())
        return default_bf16(geo.n * geo.oh * geo.ow, geo.oc, _k(geo), 1, target)

    def build(self, task: Task, config: Bf16Config, name: str, target: CpuTarget,
              prepacked: bool = False) -> Function:
        return build_conv_bf16(task, config, name, target, prepacked)


TEMPLATE = ConvBf16Template()


def can_prepack(task: Task, config: Bf16Config) -> bool:
    return True


def prepack_tag(task: Task, config: Bf16Config) -> str:
    return "bf16"


def prepack_weights(task: Task, config: Bf16Config, w: np.ndarray) -> np.ndarray:
    w = np.asarray(w, np.float32)
    return pack_weights(w.reshape(w.shape[0], -1).T)


def _k(geo: ConvGeometry) -> int:
    return geo.kh * geo.kw * geo.c


def build_conv_bf16(task: Task, cfg: Bf16Config, name: str, target: CpuTarget,
                    prepacked: bool = False) -> Function:
    geo = conv_geometry(task)
    if geo.groups != 1:
        raise ValueError(f"the bf16 convolution is for one group, got {geo.groups}")
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", "float32", task.inputs[0].shape)
    k = _k(geo)
    w = kb.buffer("w", BF16 if prepacked else "float32",
                  packed_shape(k, geo.oc) if prepacked else task.inputs[1].shape)
    bias = kb.buffer("bias", "float32", (geo.oc,)) if geo.has_bias else None
    out = kb.buffer("out", "float32", task.outputs[0].shape)
    m = geo.n * geo.oh * geo.ow
    if m * geo.oc == 0:
        return kb.finish()
    plane = geo.oh * geo.ow

    def store(bidx, row, col, v):
        n, oh, ow = row // plane, row // geo.ow % geo.oh, row % geo.ow
        at = (n, oh, ow, col) if geo.channels_last else (n, col, oh, ow)
        kb.store(out, at, v + bias[col] if bias is not None else v)

    w_shape = task.inputs[1].shape

    def b_value(mat, kk, col):      # a run-time W (not a constant): W[col] in its order
        rest, at = kk, []
        for extent in reversed(w_shape[1:]):
            at.append(rest % extent)
            rest = rest // extent
        return w[(col,) + tuple(reversed(at))]

    problem = Problem((), m, geo.oc, k, 1, lambda bidx: 0, None, 1, lambda bidx: 0,
                      None if prepacked else b_value, w if prepacked else None,
                      pack_a=lambda kb_, *at: _gather(kb_, geo, x, *at))
    emit_bf16_gemm(kb, problem, cfg, target, store)
    return kb.finish()


def _gather(kb: KernelBuilder, geo: ConvGeometry, x: Buffer, apack: Buffer,
            kp: ExprLike, i0: Expr, rows: int, base: Expr) -> None:
    """apack[0][base + r][k] = X at output position min(i0 + r, M-1), tap and channel
    of k, rounded to bf16, for r < rows; zero in the padding and for k >= K."""
    m, k = geo.n * geo.oh * geo.ow, _k(geo)
    zero = Const(0.0, "float32")
    with kb.for_range(rows, name="r") as r_in:
        r = base + r_in
        pos = _var(kb, "pos", minimum(i0 + r_in, m - 1))
        n = _var(kb, "n", pos // (geo.oh * geo.ow))
        oh = _var(kb, "oh", pos // geo.ow % geo.oh)
        ow = _var(kb, "ow", pos % geo.ow)
        if chunk_width(geo):
            _chunks(kb, geo, x, apack, (r, n, oh, ow), chunk_width(geo))
        else:
            with kb.for_range(geo.kh, name="kh") as kh:
                _taps(kb, geo, x, apack, (r, n, oh, ow), kh)
        if not isinstance(kp, int) or kp > k:
            with kb.for_range(kp - k, name="kz") as kz:
                kb.store(apack, a_at(0, r, k + kz), cast(zero, BF16))


CHUNKS = (32, 16, 8)    # chunk widths of the NHWC gather, widest dividing C first


def chunk_width(geo: ConvGeometry) -> int:
    """The NHWC gather's chunk: the widest of CHUNKS dividing C (0: none does)."""
    if not geo.channels_last:
        return 0
    return next((w for w in CHUNKS if geo.c % w == 0), 0)


def _chunks(kb: KernelBuilder, geo: ConvGeometry, x: Buffer, apack: Buffer,
            at: tuple, width: int) -> None:
    """NHWC with C a multiple of `width` (32, 16 or 8): each `width`-wide K chunk is
    that many channels of one tap, contiguous in X and within one apack tile row (32
    is a multiple of the width) -- a straight (vectorizable) copy, or zeros where the
    tap is in the padding."""
    row, n, oh, ow = at
    with kb.for_range(_k(geo) // width, name="ks") as ks:
        k0 = ks * width
        tap = _var(kb, "tap", k0 // geo.c)
        c0 = _var(kb, "c0", k0 % geo.c)
        ih = _var(kb, "ih", oh * geo.strides[0] - geo.pads[0] + tap // geo.kw * geo.dilations[0])
        iw = _var(kb, "iw", ow * geo.strides[1] - geo.pads[1] + tap % geo.kw * geo.dilations[1])
        tile, col = k0 // K_STEP, k0 % K_STEP
        with kb.if_then(logical_and(ih >= 0, ih < geo.h, iw >= 0, iw < geo.w)):
            with kb.for_range(width, name="kk") as kk:
                kb.store(apack, (0, row // 16, tile, row % 16, col + kk),
                         cast(x[n, ih, iw, c0 + kk], BF16))
        with kb.otherwise():
            with kb.for_range(width, name="kk") as kk:
                kb.store(apack, (0, row // 16, tile, row % 16, col + kk),
                         cast(Const(0.0, "float32"), BF16))


def _taps(kb: KernelBuilder, geo: ConvGeometry, x: Buffer, apack: Buffer, at: tuple,
          kh: Expr) -> None:
    """One kernel row's taps, each checked: zero where it falls in the padding."""
    row, n, oh, ow = at
    zero = Const(0.0, "float32")
    with kb.for_range(geo.kw, name="kw") as kw:
        ih = oh * geo.strides[0] - geo.pads[0] + kh * geo.dilations[0]
        iw = ow * geo.strides[1] - geo.pads[1] + kw * geo.dilations[1]
        inside = kb.declare("inside", "bool", logical_and(ih >= 0, ih < geo.h,
                                                          iw >= 0, iw < geo.w))
        ihc = _var(kb, "ihc", maximum(minimum(ih, geo.h - 1), 0))
        iwc = _var(kb, "iwc", maximum(minimum(iw, geo.w - 1), 0))
        with kb.for_range(geo.c, name="c") as c:
            if geo.channels_last:
                value, col = x[n, ihc, iwc, c], (kh * geo.kw + kw) * geo.c + c
            else:
                value, col = x[n, c, ihc, iwc], (c * geo.kh + kh) * geo.kw + kw
            kb.store(apack, a_at(0, row, col), cast(select(inside, value, zero), BF16))


def _var(kb: KernelBuilder, name: str, value: ExprLike) -> Expr:
    value = as_expr(value)
    return kb.declare(name, value.dtype, value)
