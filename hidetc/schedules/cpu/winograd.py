"""Winograd convolution for channels-last convs (ConvNHWC, f32): F(m x m, 3 x 3) and
F(m x m, 5 x 5) for 3x3 and 5x5 kernels and, along one dimension, F(m, 7) and F(m, 3)
for 1x7 / 7x1 / 1x3 / 3x1 ones.

A 3x3, stride-1, undilated, one-group conv computes each m x m block of outputs from
an a x a block of input (a = m + 2) with a*a products per (input, output) channel
pair instead of 9*m*m (Lavin & Gray, "Fast Algorithms for Convolutional Neural
Networks", 2016):

    Y = A^T [ (G g G^T) . (B^T d B) ] A        (. element-wise; d: a x a input tile)

A 1-D kernel (KH or KW = 1) transforms one dimension only (the other's matrices are
the 1 x 1 identity): Y = [ (G g) . (B^T d) ] A per row, a = m + K - 1. The F(m, 3)
matrices are the classic ones (points 0, 1, -1, 2, -2, infinity); F(m, 5) and F(m, 7)
come from `toom_cook` (points 0, +-1, +-2, +-1/2, +-3/2, infinity, as many as needed).

Summed over input channels, the element-wise products become a*a independent GEMMs,
one per position xi of the transformed tile:

    V[xi][t][c]   = (B^T d_{t,c} B)[xi]             input transform, per tile t
    U[xi][c][oc]  = (G g_{oc,c} G^T)[xi]             weights transform (compile time)
    M[xi][t][oc]  = sum_c V[xi][t][c] U[xi][c][oc]   a*a GEMMs, rows = tiles
    out[t's m x m block][oc] = (A^T M[:, t, oc] A)   output transform (+ bias)

m = 2 (16 products for 36 multiplications: 2.25x fewer) or m = 4 (36 for 144: 4x),
for 16/9 or 36/9 times the weights; 1x7: 8 for 14 and 10 for 28 (1.75x, 2.8x). The
kernel is three parallel loops (OpenMP) over scratch buffers V and M, one plane of
T x C (T x OC) per xi, each plane an odd number of cache lines long (`plane_stride`:
a*a planes 4 KiB apart would share L1 sets), with T = N * ceil(OH/m) * ceil(OW/m)
tiles:

1. input transform, per tile, in L-lane vector intrinsics along contiguous channels
   (gcc left the plain loop scalar; the channels past the last full vector go one at a
   time): from the input itself, or from its zero-padded copy
   (`conv_direct_last.padded`) when a tile reaches past the image or into the pads;
2. the GEMMs, by the blocked GEMM of `microkernel.py` over (xi, row tiles, column
   tiles) tasks: A (V's rows) read in place, B (U) in NR-wide panels
   [a*a, OC/NR, C, NR], packed when the model is compiled (`prepack_weights`, in
   float64 then rounded) or once per call from OHWI weights;
3. output transform along contiguous output channels, through an m*m x L tile buffer
   so the store to the output stays a plain loop (epilogues are grafted on it), adding
   the bias; the stores past the output (OH or OW not a multiple of m) are skipped, so
   each output element is stored exactly once.

Why it is in the space (bench/results/2026-12-01-winograd-cpu.md): F(4x4) beats the
best direct config on 3x3 convs over 14x14 and larger maps, F(2x2) on 7x7 and 8x8
maps, and the one-dimensional and 5x5 forms beat direct on Inception-V3's convs; in
the models the tuner picks them for every stride-1 conv they apply to.

Numerics: not the direct sum's order of operations. The transforms add and subtract
(and multiply by small constants: B^T's and A^T's entries up to 5 for F(4x4, 3x3), up
to 17 for F(4, 7), dyadic, so exact in f32; G's 1/4, 1/6, ... applied in float64 at
compile time), which on random data over 160-256 channels gives errors of 1e-7 to 3e-6
relative to the output's scale (more for the larger m and K), well inside the f32
tolerance (1e-4); the tests check every form against numpy in float64.

Guarantees: correct on every shape `supports` accepts (any N, C, OC, H, W, pads;
tiles past the output compute on zeros and are not stored); no load outside the input
or its padded copy.
"""
from __future__ import annotations

import functools
import itertools
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from hidetc.schedules.common.conv_geometry import ConvGeometry
from hidetc.schedules.cpu import avx2, conv_direct_last
from hidetc.schedules.cpu.microkernel import (
    MICRO_SHAPES,
    GemmConfig,
    direct_a,
    emit_gemm_tile,
    tile_extent,
)
from hidetc.schedules.cpu.task_shape import Blocking, blocking, odd_lines
from hidetc.target import CpuTarget
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Const, Expr, Function, Var, logical_and, minimum, select
from hidetc.tir.mapping import spatial

F = Fraction
# F(2x2, 3x3): interpolation points 0, 1, -1, infinity
BT2 = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
G2 = ((1, 0, 0), (F(1, 2), F(1, 2), F(1, 2)), (F(1, 2), F(-1, 2), F(1, 2)), (0, 0, 1))
AT2 = ((1, 1, 1, 0), (0, 1, -1, -1))
# F(4x4, 3x3): points 0, 1, -1, 2, -2, infinity
BT4 = ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0),
       (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1))
G4 = ((F(1, 4), 0, 0), (F(-1, 6), F(-1, 6), F(-1, 6)), (F(-1, 6), F(1, 6), F(-1, 6)),
      (F(1, 24), F(1, 12), F(1, 6)), (F(1, 24), F(-1, 12), F(1, 6)), (0, 0, 1))
AT4 = ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))
MATRICES = {(2, 3): (BT2, G2, AT2), (4, 3): (BT4, G4, AT4)}
# 1-D F(m, 7) (Inception-V3's 1x7 / 7x1 convs): Toom-Cook on these finite points and
# infinity (`toom_cook`); F(2, 7) 8 products for 14 multiplications, F(4, 7) 10 for 28.
# F(m, 5) (Inception-V3's 5x5 convs, as F(m x m, 5 x 5)): the same construction.
POINTS = {(2, 7): (0, 1, -1, 2, -2, F(1, 2), F(-1, 2)),
          (4, 7): (0, 1, -1, 2, -2, F(1, 2), F(-1, 2), F(3, 2), F(-3, 2)),
          (2, 5): (0, 1, -1, 2, -2),
          (4, 5): (0, 1, -1, 2, -2, F(1, 2), F(-1, 2))}
KERNELS = ((3, 3), (5, 5), (1, 3), (3, 1), (1, 7), (7, 1))   # (KH, KW) supported


def _poly(roots) -> list:
    """Ascending coefficients of prod (x - r) over `roots`."""
    coeffs = [F(1)]
    for r in roots:
        coeffs = [F(0)] + coeffs
        for i in range(len(coeffs) - 1):
            coeffs[i] -= r * coeffs[i + 1]
    return coeffs


def toom_cook(m: int, r: int, points) -> tuple:
    """(B^T, G, A^T) of F(m, r) from the n - 1 = m + r - 2 finite `points` and infinity:
    the transpose of the linear convolution that evaluates both polynomials at the
    points (A: the m-term input, G: the r-term filter, scaled by 1 / prod_{l != j}
    (p_j - p_l)) and interpolates the n-term product (B^T's rows: the Lagrange
    numerators, and prod (x - p_l) for the leading coefficient)."""
    pts = [F(p) for p in points]
    n = m + r - 1
    if len(pts) != n - 1:
        raise ValueError(f"F({m}, {r}) needs {n - 1} finite points, got {len(pts)}")
    evals, filt, interp = [], [], []
    for j, p in enumerate(pts):
        others = pts[:j] + pts[j + 1:]
        scale = F(1)
        for q in others:
            scale *= p - q
        evals.append([p ** i for i in range(m)])
        filt.append(tuple(p ** k / scale for k in range(r)))
        interp.append(_poly(others) + [F(0)])
    evals.append([0] * (m - 1) + [1])
    filt.append(tuple([0] * (r - 1) + [1]))
    interp.append(_poly(pts))
    bt = tuple(tuple(interp[j][i] for i in range(n)) for j in range(n))
    at = tuple(tuple(evals[j][i] for j in range(n)) for i in range(m))
    return bt, tuple(filt), at


@dataclass(frozen=True)
class _Dim:
    """One spatial dimension of the transform: m outputs per tile from a = m + k - 1
    inputs (k = 1: the identity, a plain 1-tap dimension)."""
    m: int
    k: int
    bt: tuple
    g: tuple
    at: tuple

    @property
    def a(self) -> int:
        return self.m + self.k - 1


@functools.lru_cache(maxsize=None)
def _dim(m: int, k: int) -> _Dim:
    if k == 1:
        return _Dim(1, 1, ((1,),), ((1,),), ((1,),))
    mats = MATRICES.get((m, k)) or toom_cook(m, k, POINTS[(m, k)])
    return _Dim(m, k, *mats)


def dims(geo: ConvGeometry, m: int) -> tuple[_Dim, _Dim]:
    """The (height, width) transforms of F(m, .) for this conv's kernel."""
    return _dim(m, geo.kh), _dim(m, geo.kw)


@dataclass(frozen=True)
class WinogradConfig:
    """Knobs of the Winograd conv: m outputs per tile along each transformed dimension
    (2 or 4), and the GEMM stage's micro-tile MR tiles x NR output channels and cache
    blocks MC, NC, KC."""
    m: int = 2
    mr: int = 8
    nr: int = 32
    mc: int = 64
    nc: int = 192
    kc: int = 256

    def gemm(self) -> GemmConfig:
        return GemmConfig(self.mr, self.nr, self.mc, self.nc, self.kc, pack_a=False,
                          pack_b=False)


# The space: both tile sizes x the ISA's micro-tiles x two column blocks. The short list
# (tried first on the convs `supports` accepts, `conv.ConvTemplate.short_list`): the
# winners of the space over ResNet-50's 56x56, 28x28 and 14x14 3x3 convs, weights
# packed, on a 2-core Sapphire Rapids (F(4x4) everywhere, 0.47-0.61x the best direct
# config's time), and F(2x2)'s winner on the 7x7 and 8x8 maps; AVX2's (not swept): the
# same tile sizes with its register-filling tiles.
SPACE = {isa: tuple(WinogradConfig(m, mr, nr, 64, nc, 256) for m, (mr, nr), nc in
                    itertools.product((2, 4), shapes, (192, 384)))
         for isa, shapes in MICRO_SHAPES.items()}      # per ISA name (`CpuTarget.isa`)
SHORT_LIST = {
    "avx512": (WinogradConfig(4, 14, 32, 64, 192, 256), WinogradConfig(4, 4, 64, 64, 192, 256),
               WinogradConfig(4, 8, 48, 64, 384, 256), WinogradConfig(2, 8, 48, 64, 384, 256)),
    "avx2": (WinogradConfig(4, 6, 16, 64, 192, 256), WinogradConfig(4, 4, 24, 64, 192, 256),
             WinogradConfig(2, 6, 16, 64, 384, 256))}
MIN_TILES = 4    # F(4, .) output tiles below which the GEMMs are too short (7x7 maps: 4)


def supports(geo: ConvGeometry) -> bool:
    """A channels-last conv with a `KERNELS` kernel, stride 1, no dilation and one group,
    over a map of at least MIN_TILES output tiles of F(4, .)."""
    th = -(-geo.oh // 4) if geo.kh > 1 else geo.oh
    tw = -(-geo.ow // 4) if geo.kw > 1 else geo.ow
    return (geo.channels_last and geo.groups == 1 and (geo.kh, geo.kw) in KERNELS
            and geo.strides == (1, 1) and geo.dilations == (1, 1)
            and geo.n * th * tw >= MIN_TILES)


def _array(mat) -> np.ndarray:
    return np.array([[float(v) for v in row] for row in mat])


def prepack_weights(geo: ConvGeometry, cfg: WinogradConfig, w: np.ndarray) -> np.ndarray:
    """OHWI weights [OC, KH, KW, C] as U = G_h g G_w^T in NR-wide panels
    [AH*AW, panels, C, NR] (computed in float64, rounded once; output channels past OC
    zero)."""
    dh, dw = dims(geo, cfg.m)
    nxi = dh.a * dw.a
    panels = -(-geo.oc // cfg.nr)
    wt = np.asarray(w, np.float64).reshape(geo.oc, geo.kh, geo.kw, geo.c)
    u = np.einsum("ik,okld,jl->ijdo", _array(dh.g), wt, _array(dw.g)).reshape(nxi, geo.c, geo.oc)
    out = np.zeros((nxi, geo.c, panels * cfg.nr), np.asarray(w).dtype)
    out[:, :, :geo.oc] = u
    return np.ascontiguousarray(out.reshape(nxi, geo.c, panels, cfg.nr).transpose(0, 2, 1, 3))


def prepack_tag(cfg: WinogradConfig) -> str:
    return f"wg{cfg.m}n{cfg.nr}"


def _blocking(geo: ConvGeometry, cfg: WinogradConfig, target: CpuTarget) -> Blocking:
    dh, dw = dims(geo, cfg.m)
    return blocking(cfg.gemm(), _tiles(geo, dh, dw)[0], geo.oc, geo.c, dh.a * dw.a, target)


def _tiles(geo: ConvGeometry, dh: _Dim, dw: _Dim) -> tuple[int, int, int]:
    """(rows = N * TH * TW, TH, TW)."""
    th, tw = -(-geo.oh // dh.m), -(-geo.ow // dw.m)
    return geo.n * th * tw, th, tw


def kernel_key(geo: ConvGeometry, cfg: WinogradConfig, target: CpuTarget) -> tuple:
    """What the kernel depends on: m and the GEMM's blocking on this shape."""
    return "winograd", cfg.m, _blocking(geo, cfg, target)


class _Scalar:
    """Arithmetic, loads and stores on scalar IR expressions (the transforms' channel
    remainder)."""
    def __init__(self, dt: str):
        self.dtype = dt

    def add(self, a: Expr, b: Expr) -> Expr:
        return a + b

    def sub(self, a: Expr, b: Expr) -> Expr:
        return a - b

    def scale(self, c: float, v: Expr) -> Expr:
        return Const(c, self.dtype) * v

    def neg(self, v: Expr) -> Expr:
        return -v

    def load(self, kb: KernelBuilder, at: Expr, hint: str) -> Var:
        return kb.declare(hint, self.dtype, at)

    def store(self, kb: KernelBuilder, at: Expr, value: Var) -> None:
        kb.store(at.buffer, at.indices, value)


class _Vector:
    """The same on L-lane vectors (AVX2 / AVX-512 intrinsics)."""
    def __init__(self, lanes: int):
        self.lanes, self.dtype = lanes, avx2.vector_dtype(lanes)

    def _op(self, name: str, *args: Expr) -> Expr:
        return avx2.vcall(avx2.op(name, self.lanes), *args, dtype=self.dtype)

    def add(self, a: Expr, b: Expr) -> Expr:
        return self._op("add", a, b)

    def sub(self, a: Expr, b: Expr) -> Expr:
        return self._op("sub", a, b)

    def scale(self, c: float, v: Expr) -> Expr:
        return self._op("mul", self._op("set1", Const(c, "float32")), v)

    def neg(self, v: Expr) -> Expr:
        return self._op("sub", self._op("setzero"), v)

    def load(self, kb: KernelBuilder, at: Expr, hint: str) -> Var:
        return kb.declare(hint, self.dtype, avx2.load(at, self.lanes))

    def store(self, kb: KernelBuilder, at: Expr, value: Var) -> None:
        avx2.store(kb, at, value)


def _combine(ar, coeffs, values: list[Expr]) -> Expr:
    """sum_k coeffs[k] * values[k]: the zero terms left out, the positive terms first
    (then no negation is needed for any row of B^T or A^T), +-1 as adds and
    subtractions, summed left to right."""
    terms = [(c, v) for c, v in zip(coeffs, values) if c != 0]
    terms.sort(key=lambda cv: cv[0] < 0)        # stable: positives first, in order
    out: Expr | None = None
    for c, v in terms:
        mag = float(abs(c))
        term = v if mag == 1 else ar.scale(mag, v)
        if out is None:
            out = ar.neg(term) if c < 0 else term
        else:
            out = ar.sub(out, term) if c < 0 else ar.add(out, term)
    if out is None:
        raise ValueError("a transform row of zeros")
    return out


def _sandwich(kb: KernelBuilder, ar, left, right, values: list[list[Expr]],
              hint: str) -> list[list[Var]]:
    """left x values x right^T with constant matrices: every intermediate and result
    declared once (each is used several times, or stored)."""
    rows = [[kb.declare(hint, ar.dtype, _combine(ar, lrow, [vrow[j] for vrow in values]))
             for j in range(len(values[0]))] for lrow in left]
    return [[kb.declare(hint, ar.dtype, _combine(ar, rrow, row)) for rrow in right]
            for row in rows]


def _by_lanes(kb: KernelBuilder, count: int, lanes: int, body) -> None:
    """body(ar, c0, lanes) over channels 0..count-1: `lanes`-wide vectors (the target
    ISA's), then the rest one channel at a time."""
    full = count // lanes
    if full:
        with kb.for_range(full, name="cv") as cv:
            body(_Vector(lanes), cv * lanes, lanes)
    if count % lanes:
        with kb.for_range(count % lanes, name="cr") as cr:
            body(_Scalar("float32"), full * lanes + cr, 1)


def build_winograd(geo: ConvGeometry, cfg: WinogradConfig, dt: str, name: str,
                   target: CpuTarget, prepacked: bool = False) -> Function:
    """The kernel (see the module docstring); `prepacked`: the weights arrive in the
    layout of `prepack_weights`, else as OHWI [OC, KH*KW*C] and are transformed per
    call."""
    if dt != "float32":
        raise ValueError(f"the Winograd convolution is f32 only, got {dt}")
    if not supports(geo):
        raise ValueError(f"the Winograd convolution needs a channels-last conv with a "
                         f"{' / '.join(f'{h}x{w}' for h, w in KERNELS)} kernel, stride 1, "
                         f"no dilation and one group, got {geo}")
    dh, dw = dims(geo, cfg.m)
    nxi = dh.a * dw.a
    rows, th, tw = _tiles(geo, dh, dw)
    bl = _blocking(geo, cfg, target)
    panels = -(-geo.oc // bl.nr)
    kb = KernelBuilder(name, "cpu")
    x = kb.buffer("x", dt, (geo.n, geo.h * geo.w, geo.c))
    w = kb.buffer("w", dt, (nxi, panels, geo.c, bl.nr) if prepacked
                  else (geo.oc, geo.taps * geo.c))
    bias = kb.buffer("bias", dt, (geo.oc,)) if geo.has_bias else None
    out = kb.buffer("out", dt, (geo.n, geo.oh * geo.ow, geo.oc))
    u = w if prepacked else _transform_weights(kb, geo, bl, dh, dw, w, panels, dt)
    vstride = plane_stride(rows, geo.c)
    v = _transform_input(kb, geo, dh, dw, x, (rows, th, tw), vstride, dt, bl.lanes)
    ostride = plane_stride(rows, geo.oc)
    prod = kb.alloc("wgm", dt, (nxi * ostride,))
    tasks = (nxi, bl.m_tiles, bl.n_tiles)
    with kb.for_range(tasks[0] * tasks[1] * tasks[2], kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(*tasks), p, names=["e", "ib", "jb"]) as (e, ib, jb):
            i0, j0 = ib * bl.mt, jb * bl.nc
            a_panel = direct_a(bl, lambda r, kk, e=e: v[e * vstride + r * geo.c + kk])

            def b_panel(kk, jp, j, e=e, jb=jb):
                return u[e, jb * (bl.nc // bl.nr) + jp, kk, j]

            def store(r, j, val, e=e, i0=i0, j0=j0):
                kb.store(prod, e * ostride + (i0 + r) * geo.oc + j0 + j, val)
            emit_gemm_tile(kb, bl, dt, i0, (tile_extent(rows, i0, bl.mt),
                                            tile_extent(geo.oc, j0, bl.nc)),
                           a_panel, None, store, b_prepacked=b_panel)
    _transform_output(kb, geo, dh, dw, prod, ostride, bias, out, th, tw, dt, bl.lanes)
    return kb.finish()


def plane_stride(rows: int, width: int) -> int:
    """Floats between two positions' planes of a scratch buffer (rows x width each),
    `odd_lines`: the a*a streams a transform reads or writes at once do not all fall
    into the same L1 sets (4 KiB apart, they would)."""
    return odd_lines(rows * width)


def _transform_weights(kb: KernelBuilder, geo: ConvGeometry, bl: Blocking, dh: _Dim,
                       dw: _Dim, w: Buffer, panels: int, dt: str) -> Buffer:
    """`prepack_weights` at run time (in f32), in parallel over the NR-wide panels."""
    u = kb.alloc("wgu", dt, (dh.a * dw.a, panels, geo.c, bl.nr))
    zero = Const(0.0, dt)
    with kb.for_range(panels, kind="parallel", name="jp") as jp, \
            kb.for_range(bl.nr, name="j") as j, kb.for_range(geo.c, name="c") as c:
        oc = jp * bl.nr + j
        inside = oc < geo.oc
        row = minimum(oc, geo.oc - 1)

        def tap(y: int, x: int) -> Expr:
            value = w[row, (y * geo.kw + x) * geo.c + c]
            return select(inside, value, zero) if panels * bl.nr > geo.oc else value
        g = [[kb.declare("g", dt, tap(y, x)) for x in range(geo.kw)] for y in range(geo.kh)]
        vals = _sandwich(kb, _Scalar(dt), dh.g, dw.g, g, "gt")
        for i, jj in itertools.product(range(dh.a), range(dw.a)):
            kb.store(u, (i * dw.a + jj, jp, c, j), vals[i][jj])
    return u


def _transform_input(kb: KernelBuilder, geo: ConvGeometry, dh: _Dim, dw: _Dim, x: Buffer,
                     tiles: tuple[int, int, int], stride: int, dt: str, lanes: int
                     ) -> Buffer:
    """V[xi][t][c] = (B_h^T d B_w)[xi] for every tile t, in parallel over tiles
    (`tiles`: rows = N * TH * TW, TH, TW)."""
    rows, th, tw = tiles
    hp, wp = th * dh.m + dh.k - 1, tw * dw.m + dw.k - 1
    if geo.pads == (0, 0) and hp <= geo.h and wp <= geo.w:
        src, width = x, geo.w
    else:
        src, width = conv_direct_last.padded(kb, geo, x, hp, wp), wp
    v = kb.alloc("wgv", dt, (dh.a * dw.a * stride,))
    with kb.for_range(rows, kind="parallel", name="t") as t:
        with kb.for_mapping(spatial(geo.n, th, tw), t, names=["b", "ty", "tx"]) as (b, ty, tx):
            base = kb.declare("base", "int32", ty * (dh.m * width) + tx * dw.m)

            def body(ar, c, lanes, b=b, t=t, base=base):
                d = [[ar.load(kb, src[b, base + (i * width + j), c], "d")
                      for j in range(dw.a)] for i in range(dh.a)]
                vals = _sandwich(kb, ar, dh.bt, dw.bt, d, "bd")
                for i, j in itertools.product(range(dh.a), range(dw.a)):
                    ar.store(kb, v[(i * dw.a + j) * stride + t * geo.c + c], vals[i][j])
            _by_lanes(kb, geo.c, lanes, body)
    return v


def _transform_output(kb: KernelBuilder, geo: ConvGeometry, dh: _Dim, dw: _Dim,
                      prod: Buffer, stride: int, bias: Buffer | None, out: Buffer, th: int,
                      tw: int, dt: str, lanes: int) -> None:
    """out[MH x MW block of tile t][oc] = (A_h^T M[:, t, oc] A_w) + bias, in parallel
    over tiles; outputs past OH or OW are not stored."""
    with kb.for_range(geo.n * th * tw, kind="parallel", name="t") as t:
        ybuf = kb.alloc("ybuf", dt, (dh.m * dw.m, lanes))
        with kb.for_mapping(spatial(geo.n, th, tw), t, names=["b", "ty", "tx"]) as (b, ty, tx):
            oy0, ox0 = ty * dh.m, tx * dw.m
            base = kb.declare("obase", "int32", oy0 * geo.ow + ox0)

            def body(ar, c, lanes, b=b, t=t, base=base, oy0=oy0, ox0=ox0):
                mv = [[ar.load(kb, prod[(i * dw.a + j) * stride + t * geo.oc + c], "mv")
                       for j in range(dw.a)] for i in range(dh.a)]
                vals = _sandwich(kb, ar, dh.at, dw.at, mv, "am")
                for i, j in itertools.product(range(dh.m), range(dw.m)):
                    if lanes > 1:       # through a tile buffer: the store stays scalar
                        avx2.store(kb, ybuf[i * dw.m + j, 0], vals[i][j])
                    with _maybe(kb, _inside(geo, dh, dw, oy0, ox0, i, j)), \
                            kb.for_range(lanes, name="l") as lane:
                        val = ybuf[i * dw.m + j, lane] if lanes > 1 else vals[i][j]
                        if bias is not None:
                            val = val + bias[c + lane]
                        kb.store(out, (b, base + (i * geo.ow + j), c + lane), val)
            _by_lanes(kb, geo.oc, lanes, body)


@contextmanager
def _maybe(kb: KernelBuilder, cond: Expr | None):
    """An if_then block, or none when `cond` is None."""
    if cond is None:
        yield
        return
    with kb.if_then(cond):
        yield


def _inside(geo: ConvGeometry, dh: _Dim, dw: _Dim, oy0: Expr, ox0: Expr, i: int,
            j: int) -> Expr | None:
    """Whether output (oy0 + i, ox0 + j) exists; None when it always does (OH, OW
    multiples of the tile, or the first row/column of a tile)."""
    conds = []
    if i > 0 and geo.oh % dh.m:
        conds.append(oy0 + i < geo.oh)
    if j > 0 and geo.ow % dw.m:
        conds.append(ox0 + j < geo.ow)
    if not conds:
        return None
    return conds[0] if len(conds) == 1 else logical_and(*conds)
