"""CUDA template: 2-D convolution (NCHW input, OIHW weights, groups, strides, pads incl.
auto_pad, dilations, optional bias input 2) as an implicit GEMM on the SIMT cores,
float32 (float16 and bfloat16 storage with float32 accumulation, float64 in float64).

Schedule: the shared SIMT GEMM of `gemm_simt` (block tiles, composed thread mappings,
double-buffered global -> register -> shared pipeline, predicated loads and stores,
block swizzle; see its docstring), one GEMM per (image, group):

    C[OC/G, OH*OW] = A[OC/G, C/G*KH*KW] x B[C/G*KH*KW, OH*OW]
    A[m, k] = w[g*OC/G + m, k]                (the OIHW weights viewed [OC, C/G*KH*KW])
    B[k, p] = x[b, g*C/G + ic, iy, ix]        im2col, gathered while loading the tile:
              k = (ic, ky, kx), p = (oy, ox), iy = oy*sh - ph + ky*dh, ix likewise
    out[b, g*OC/G + m, p] = C[m, p] (+ bias[g*OC/G + m])

- batch: the (image, group) pairs are the GEMM's batch (blocks `pid // tiles`, image
  major), not folded into the column dimension: a column is then a pure (oy, ox) pair
  (one div/mod by OW per element, no image index), the benchmark models run batch 1
  where folding changes nothing, and the output rows stay contiguous for float4 stores.
- im2col is never materialized: the B element hook computes (ic, ky, kx) and (oy, ox)
  from the tile coordinates and predicates the load on k < K, p < OH*OW and the input
  bounds (each bound only when the geometry can cross it, decided at build time); a
  padding tap is a zero, no address outside the input is ever formed.
- vectors (float32 and `config.vector` only): A's rows are whole weight filters,
  contiguous, so float4 loads when C/G*KH*KW % 4 == 0; B is a scalar gather except for
  a pointwise conv (1x1, stride 1, no padding), where B is x viewed [C, H*W] and float4
  loads need H*W % 4 == 0; the stores (+ bias, added in registers first) are float4
  when OH*OW % 4 == 0 (output rows [OH*OW] contiguous and aligned).
- space: `gemm_simt.config_space()` (200 configs, independent of the shape), each at
  the task's split-K; default: `gemm_simt.default_config(OC/G, OH*OW, K, N*G, SMs)`.

Depthwise convolution (one input channel per group, more than one group) is a GEMM
with M = channel multiplier and K = KH*KW: `build` handles it correctly, but the rule
(`build_conv`) keeps the direct kernel of `conv.py` for it.

Assumes: buffers 16-byte aligned (hidetc's arena and weights are 64-byte aligned).
Guarantees: correct for every config on every shape; no memory access outside the
operands; half results are the float32 sums (+ bias) rounded once.
"""
from __future__ import annotations

from typing import Optional, Sequence

from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.common.conv_geometry import conv_geometry
from hidetc.schedules.cuda import conv, split_k
from hidetc.schedules.cuda.gemm_simt import (
    F32,
    FLOAT_DTYPES,
    Element,
    SimtConfig,
    SimtGemm,
    config_space,
    default_config,
    split_for,
)
from hidetc.schedules.cuda.tc_common import cuda_target
from hidetc.schedules.template import Target
from hidetc.tir.ir import Buffer, Expr, ExprLike, Function, as_expr, cast, logical_and


class ConvGemmTemplate:
    name = "cuda.conv_gemm"
    precisions = ("f32", "f16", "bf16")

    def space(self, task: Task, target: Target) -> Sequence[SimtConfig]:
        """The shape-free configs, each at its split-K for this task (`split_for`)."""
        if task is None:
            return config_space()
        g = conv_geometry(task)
        k = g.icg * g.taps
        return [split_for(c, g.ocg, g.oh * g.ow, k, g.n * g.groups, cuda_target(target).sms)
                for c in config_space()]

    def default(self, task: Task, target: Target) -> SimtConfig:
        g = conv_geometry(task)
        return default_config(g.ocg, g.oh * g.ow, g.icg * g.taps, g.n * g.groups,
                              cuda_target(target).sms)

    over_range = staticmethod(split_k.unsplit)   # (the tile count sizes split-K)

    def build(self, task: Task, config: SimtConfig, name: str, target: Target) -> Function:
        return build_conv_gemm(task, config, name)


TEMPLATE = ConvGemmTemplate()


def build_conv(task: Task, name: str) -> Function:
    """The rule entry, for depthwise convolutions: the direct kernel (`conv.py`); the
    others are templated (`kernel_choice`)."""
    if not conv_geometry(task).depthwise:
        raise ValueError("a dense Conv runs on the template: build it with build_kernel")
    return conv.build_direct_conv(task, name)


def _add(a: ExprLike, b: ExprLike) -> ExprLike:
    """a + b without a literal 0 term."""
    if isinstance(a, int) and a == 0:
        return b
    if isinstance(b, int) and b == 0:
        return a
    return as_expr(a) + b


def _affine(v: ExprLike, scale: int, offset: int) -> ExprLike:
    """v * scale + offset without the trivial terms."""
    if isinstance(v, int):
        return v * scale + offset
    return _add(v * scale if scale != 1 else v, offset)


def _divmod(v: ExprLike, extent: int) -> tuple[ExprLike, ExprLike]:
    return (v, 0) if extent == 1 else (v // extent, v % extent)


class _ConvKernel(SimtGemm):
    """The SIMT GEMM over the (image, group) pairs, im2col gathered by `b_element`."""

    def __init__(self, task: Task, cfg: SimtConfig, name: str):
        self.g = g = conv_geometry(task)
        dt = task.outputs[0].dtype
        super().__init__(cfg, name, dt, g.ocg, g.oh * g.ow, g.icg * g.taps,
                         g.n * g.groups, what="Conv")
        vector = cfg.vector and dt == F32
        self.va = 4 if vector and self.k % 4 == 0 else 1
        self.vb = 4 if vector and g.pointwise and self.n % 4 == 0 else 1
        self.vc = 4 if vector and self.n % 4 == 0 else 1
        kb = self.kb
        self.x = kb.buffer("x", dt, (g.n, g.c, g.h * g.w) if g.pointwise else
                           (g.n, g.c, g.h, g.w))
        self.w = kb.buffer("w", dt, (g.oc, self.k))
        self.bias_buf = kb.buffer("bias", dt, (g.oc,)) if g.has_bias else None
        self.out = kb.buffer("out", dt, (g.n, g.oc, self.n))

    def _var(self, name: str, value: ExprLike) -> ExprLike:
        return value if isinstance(value, int) else self.kb.declare(name, "int32", value)

    def batch_origin(self, entry: Expr) -> None:
        g = self.g
        if self.nbatch == 1:
            img, grp = 0, 0
        elif g.groups == 1:
            img, grp = entry, 0
        elif g.n == 1:
            img, grp = 0, entry
        else:
            img, grp = entry // g.groups, entry % g.groups
        self.img = self._var("img", img)
        self.ch0 = self._var("ch0", grp * g.icg)
        self.oc0 = self._var("oc0", grp * g.ocg)

    def a_element(self, row: Expr, col: Expr) -> Element:
        return (self.w, (as_expr(_add(self.oc0, row)), col),
                logical_and(row < self.m, col < self.k))

    def b_element(self, row: Expr, col: Expr) -> Element:
        g, inside = self.g, [row < self.k, col < self.n]
        if g.pointwise:
            return self.x, (as_expr(self.img), as_expr(_add(self.ch0, row)), col), \
                logical_and(*inside)
        ic, tap = _divmod(row, g.taps)
        ky, kx = _divmod(tap, g.kw)
        oy, ox = _divmod(col, g.ow)
        iy = _add(_affine(oy, g.strides[0], -g.pads[0]), _affine(ky, g.dilations[0], 0))
        ix = _add(_affine(ox, g.strides[1], -g.pads[1]), _affine(kx, g.dilations[1], 0))
        inside += _bounds(iy, g.h, g.pads[0], g.oh, g.kh, g.strides[0], g.dilations[0])
        inside += _bounds(ix, g.w, g.pads[1], g.ow, g.kw, g.strides[1], g.dilations[1])
        idx = (self.img, _add(self.ch0, ic), iy, ix)
        return self.x, tuple(as_expr(i) for i in idx), logical_and(*inside)

    def c_element(self, row: Expr, col: Expr) -> tuple[Buffer, tuple[Expr, ...]]:
        return self.out, (as_expr(self.img), as_expr(_add(self.oc0, row)), col)

    def bias(self, row: Expr, col: Expr) -> Optional[Expr]:
        if self.bias_buf is None:
            return None
        return cast(self.bias_buf[_add(self.oc0, row)], self.acc_dt)


def _bounds(i: ExprLike, size: int, pad: int, out: int, kernel: int, stride: int,
            dilation: int) -> list[Expr]:
    """The checks 0 <= i < size that the geometry can fail (for valid output positions:
    i ranges over [-pad, (out - 1) * stride - pad + (kernel - 1) * dilation])."""
    checks = []
    if pad > 0:
        checks.append(as_expr(i) >= 0)
    if (out - 1) * stride - pad + (kernel - 1) * dilation >= size:
        checks.append(as_expr(i) < size)
    return checks


def build_conv_gemm(task: Task, cfg: SimtConfig, name: str) -> Function:
    """The kernel of `cfg` for `task` (see the module docstring)."""
    if task.outputs[0].dtype not in FLOAT_DTYPES:
        raise UnsupportedOpError(f"Conv: SIMT implicit GEMM for float tensors, got "
                                 f"{task.signature()}")
    return _ConvKernel(task, cfg, name).build()

