"""CPU template for the 2-D integer convolutions (`hidetc.graph.ops.integer`):
ConvInteger (NCHW, OIHW weights) and ConvIntegerNHWC (NHWC, OHWI weights), uint8 / int8
operands, int32 out.

One group: an implicit GEMM over every output position of the batch at once (as the
bf16 one, `conv_bf16`): out[pos][oc] = im2col(X - x_zero)[pos][k] x (W - w_zero)^T[k][oc],
M = N*OH*OW, N = OC, K = KH*KW*C in the weights' own order, through
`gemm_int8.emit_int8_gemm`; the weights packed once at compile time when constant
(`prepack_weights`: int8 quads, a quarter of the f32 bytes). The im2col gather is the A
packing (`_gather`): per output position and tap one run of C channels (NHWC: contiguous
in X) or one element per channel (NCHW), X' = X (+128 for int8), and ZA (x_zero + 128
for int8: zero after the shift) for a tap in the padding -- the padding ONNX defines
(the shifted input padded with zeros). Several groups (MobileNet's depthwise convs):
`_build_grouped`, a direct kernel (per output position a row of int32 accumulators, the
taps added along the output channels; the weights prepacked tap-major).

Guarantees: the reference's exact integers for any geometry (strides, pads, dilations,
groups, symbolic batch; K <= gemm_int8.MAX_K).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hidetc.compute.task import Task
from hidetc.schedules.common.conv_geometry import ConvGeometry, conv_geometry
from hidetc.schedules.cpu.gemm_int8 import (
    Int8Config,
    Problem,
    a_at,
    default_int8,
    emit_int8_gemm,
    int8_space,
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
from hidetc.tir.mapping import spatial


class ConvInt8Template:
    name = "cpu.conv.int8"
    precisions = ("int8",)     # the catalog's rows (`hidetc inspect --space`)

    def space(self, task: Task, target: CpuTarget) -> Sequence[Int8Config]:
        return int8_space() if conv_geometry(task).groups == 1 else [Int8Config()]

    def short_list(self, task: Task, target: CpuTarget) -> Sequence[Int8Config]:
        if conv_geometry(task).groups != 1:
            return ()
        return (Int8Config(128, 256), Int8Config(64, 64), Int8Config(32, 128))

    def default(self, task: Task, target: CpuTarget) -> Int8Config:
        geo = conv_geometry(task.hinted())
        return default_int8(geo.n * geo.oh * geo.ow, geo.oc, 1, target)

    def build(self, task: Task, config: Int8Config, name: str, target: CpuTarget,
              prepacked: bool = False) -> Function:
        return build_conv_int8(task, config, name, target, prepacked)


TEMPLATE = ConvInt8Template()


def can_prepack(task: Task, config: Int8Config) -> bool:
    return True


def prepack_tag(task: Task, config: Int8Config) -> str:
    return "int8" if conv_geometry(task).groups == 1 else "int8_taps"


def prepack_weights(task: Task, config: Int8Config, w: np.ndarray) -> np.ndarray:
    """One group: the GEMM's quads (`gemm_int8.pack_weights`); several: the weights
    tap-major, [KH][KW][C/G][OC] in their own type (`_build_grouped` reads a tap's
    output channels contiguously)."""
    w = np.asarray(w)
    if conv_geometry(task).groups != 1:
        taps = (1, 2, 3, 0) if conv_geometry(task).channels_last else (2, 3, 1, 0)
        return np.ascontiguousarray(w.transpose(taps))
    return pack_weights(w.reshape(w.shape[0], -1).T, task.inputs[1].dtype)


def _tap_major(geo: ConvGeometry) -> tuple[int, int, int, int]:
    return geo.kh, geo.kw, geo.icg, geo.oc


def _k(geo: ConvGeometry) -> int:
    return geo.kh * geo.kw * geo.icg


def _zero_buffers(kb: KernelBuilder, task: Task) -> tuple:
    zeros = [task.inputs[i] if len(task.inputs) > i else None for i in (2, 3)]
    x_zero = kb.buffer("x_zero", zeros[0].dtype, (1,)) if zeros[0] is not None else None
    w_zero = (kb.buffer("w_zero", zeros[1].dtype, (max(zeros[1].size, 1),))
              if zeros[1] is not None else None)
    per_channel = w_zero is not None and zeros[1].size != 1
    return x_zero, w_zero, per_channel


def build_conv_int8(task: Task, cfg: Int8Config, name: str, target: CpuTarget,
                    prepacked: bool = False) -> Function:
    geo = conv_geometry(task)
    x_type, w_type = task.inputs[0], task.inputs[1]
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", x_type.dtype, x_type.shape)
    k = _k(geo)
    if not prepacked:
        w = kb.buffer("w", w_type.dtype, w_type.shape)
    elif geo.groups == 1:
        w = kb.buffer("w", "int32", packed_shape(k, geo.oc))
    else:
        w = kb.buffer("w", w_type.dtype, _tap_major(geo))
    x_zero, w_zero, per_channel = _zero_buffers(kb, task)
    out = kb.buffer("out", "int32", task.outputs[0].shape)
    if geo.n * geo.oh * geo.ow * geo.oc == 0:
        return kb.finish()
    if geo.groups != 1:
        _build_grouped(kb, geo, (x, w, x_zero, w_zero, out), per_channel, prepacked)
        return kb.finish()
    m, plane = geo.n * geo.oh * geo.ow, geo.oh * geo.ow

    def store(bidx, row, col, v):
        n, oh, ow = row // plane, row // geo.ow % geo.oh, row % geo.ow
        kb.store(out, (n, oh, ow, col) if geo.channels_last else (n, col, oh, ow), v)

    w_shape = w_type.shape

    def b_value(mat, kk, col):      # a run-time W (not a constant): W[col] in its order
        rest, at = kk, []
        for extent in reversed(w_shape[1:]):
            at.append(rest % extent)
            rest = rest // extent
        return w[(col,) + tuple(reversed(at))]

    problem = Problem(
        (), m, geo.oc, k, x_type.dtype, w_type.dtype, 1, lambda bidx: 0, None, 1,
        lambda bidx: 0, None if prepacked else b_value, w if prepacked else None,
        x_zero[0] if x_zero is not None else None,
        None if w_zero is None else (lambda col: w_zero[col if per_channel else 0]),
        pack_a=lambda kb_, *at: _gather(kb_, geo, x, problem, *at))
    emit_int8_gemm(kb, problem, cfg, target, store)
    return kb.finish()


def _gather(kb: KernelBuilder, geo: ConvGeometry, x: Buffer, p: Problem, apack: Buffer,
            rowsum: Buffer | None, i0: Expr, rows: int, base: Expr) -> None:
    """apack[0][base + r][k] = X' at output position min(i0 + r, M-1), tap and channel
    of k, ZA in the padding, zero for k >= K; rowsum[0][base + r] their sum."""
    m, k = geo.n * geo.oh * geo.ow, _k(geo)
    kp = -(-k // 64) * 64
    za = p.za
    pad = cast(za, "int32") if za is not None else Const(0, "int32")
    with kb.for_range(rows, name="r") as r_in:
        r = base + r_in
        pos = _var(kb, "pos", minimum(i0 + r_in, m - 1))
        n = _var(kb, "n", pos // (geo.oh * geo.ow))
        oh = _var(kb, "oh", pos // geo.ow % geo.oh)
        ow = _var(kb, "ow", pos % geo.ow)
        total = kb.declare("total", "int32", Const(0, "int32")) if rowsum is not None else None
        with kb.for_range(geo.kh, name="kh") as kh, kb.for_range(geo.kw, name="kw") as kw:
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
                shifted = _var(kb, "v", select(inside, p.a_prime(value), pad))
                kb.store(apack, a_at(0, r, col), cast(shifted, "uint8"))
                if total is not None:
                    kb.assign(total, total + shifted)
        if kp > k:
            with kb.for_range(kp - k, name="kz") as kz:
                kb.store(apack, a_at(0, r, k + kz), Const(0, "uint8"))
        if rowsum is not None:
            kb.store(rowsum, (0, r), total)


def _build_grouped(kb: KernelBuilder, geo: ConvGeometry, buffers: tuple, per_channel: bool,
                   prepacked: bool) -> None:
    """Several groups: out[n][oh][ow][oc] (or NCHW) = sum over the group's channels and
    taps of (X - x_zero)(W - w_zero[oc]) in int32, taps in the padding skipped. Per
    output position, an int32 row of OC accumulators, each inside tap adding along the
    output channels (contiguous in the tap-major prepacked weights and, for a depthwise
    NHWC conv, in X: the loop vectorizes)."""
    x, w, x_zero, w_zero, out = buffers
    zx = cast(x_zero[0], "int32") if x_zero is not None else Const(0, "int32")
    rows = geo.n * geo.oh * geo.ow
    with kb.for_range(rows, kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(geo.n, geo.oh, geo.ow), p, names=["n", "oh", "ow"]) \
                as (n, oh, ow):
            acc = kb.alloc("acc", "int32", (geo.oc,))
            with kb.for_range(geo.oc, name="oc") as oc:
                kb.store(acc, (oc,), Const(0, "int32"))
            with kb.for_range(geo.kh, name="kh") as kh, kb.for_range(geo.kw, name="kw") as kw:
                ih = _var(kb, "ih", oh * geo.strides[0] - geo.pads[0] + kh * geo.dilations[0])
                iw = _var(kb, "iw", ow * geo.strides[1] - geo.pads[1] + kw * geo.dilations[1])
                with kb.if_then(logical_and(ih >= 0, ih < geo.h, iw >= 0, iw < geo.w)):
                    with kb.for_range(geo.icg, name="c") as c, \
                            kb.for_range(geo.oc, name="oc") as oc:
                        ch = oc // geo.ocg * geo.icg + c
                        xv = x[n, ih, iw, ch] if geo.channels_last else x[n, ch, ih, iw]
                        if prepacked:
                            wv = w[kh, kw, c, oc]
                        else:
                            wv = w[oc, kh, kw, c] if geo.channels_last else w[oc, c, kh, kw]
                        zw = (cast(w_zero[oc if per_channel else 0], "int32")
                              if w_zero is not None else Const(0, "int32"))
                        kb.store(acc, (oc,), acc[oc] + (cast(xv, "int32") - zx)
                                 * (cast(wv, "int32") - zw))
            with kb.for_range(geo.oc, name="oc") as oc:
                at = (n, oh, ow, oc) if geo.channels_last else (n, oc, oh, ow)
                kb.store(out, at, acc[oc])


def _var(kb: KernelBuilder, name: str, value: ExprLike) -> Expr:
    value = as_expr(value)
    return kb.declare(name, value.dtype, value)
