"""The int8 GEMM of the cpu target: the integer anchors (MatMulInteger, ConvInteger,
`hidetc.graph.ops.integer`), uint8 / int8 operands, exact int32 results.

For `batch` problems C = (A - za) x (B - zb) of M x N x K (A and B uint8 or int8, za per
tensor, zb per tensor or per column), the kernel computes with the operands the
instructions take -- A' = A (+ 128 for int8 A) as uint8, B' = B (- 128 for uint8 B) as
int8 -- and corrects in the store. With ZA = za (+ 128) and DB_j = (128 for uint8 B) -
zb_j:

    sum_k (A - za)(B - zb) = sum_k A'B'  -  ZA * colsum_j(B')  +  DB_j * (rowsum_i(A') - ZA K)

all in int32 (exact while K * 383 * 255 < 2^31: `MAX_K`). The kernel in words:

    apack[mat][Mp/16][Kp/64][16][64]  (uint8 16 x 64 tiles, `a_at`; once per call in
        parallel over 16-row blocks, or per task for an im2col gather: `Problem.pack_a`):
        A'_mat[min(row, M-1)][k]; zero for k >= K (Mp = M rounded up to 16, Kp to 64);
        rowsum[mat][row] beside it where some DB_j can be nonzero (a uint8 B, or a zb)
    bpack[mat][N/16 panels][Kp/4 + 1][16] (int32; packed at compile time when B is a
        constant -- `pack_weights`, stored as int8 quads: a quarter of the f32 bytes --,
        else once per call): rows i < Kp/4 the 4-interleaved layout `vpdpbusd` reads
        (B'[4i..4i+3][j] in the four bytes of one int32), row Kp/4 colsum_j(B'); zero
        past K and N
    tasks (batch, M/MT, N/NC) in one parallel loop, each:
        cbuf[MT][NC+16] = the block helper over its rows and panels (`c_int8`: AMX-INT8
                          tiles, AVX512_VNNI, AVX-VNNI, or exact AVX2 `vpmaddwd`)
        store(bt, i0 + r, j0 + j, cbuf[r][j] + the correction) for the valid r, j

Rows past M are clamped on load (computed, never stored), columns past N and the K
padding are zeros in both packed operands, so any M, N and K <= MAX_K (symbolic M, N:
the extents are expressions) computes exactly the reference's integers. The knobs
(`Int8Config`): MT rows x NC columns per task, the bf16 GEMM's space and default rule
(`gemm_bf16.balanced_tile`).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from hidetc.compute.injective import unravel
from hidetc.errors import UnsupportedOpError
from hidetc.graph.guards import hint_value
from hidetc.schedules.cpu.gemm_bf16 import balanced_tile, round_up
from hidetc.schedules.cpu.microkernel import ceil_div
from hidetc.schedules.template import CpuTarget
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.intrinsics import INT8_AMX, INT8_AVX2, INT8_AVXVNNI, INT8_VNNI
from hidetc.tir.ir import Buffer, Const, Expr, ExprLike, call, cast, logical_and, minimum, select
from hidetc.tir.mapping import spatial

ROWS = 16        # apack's row padding and MT's unit: one 16 x 64 tile
PANEL = 16       # columns of a B panel (one zmm of int32)
K_STEP = 64      # bytes per apack tile row: Kp's unit
CBUF_PAD = 16    # int32 past NC in a cbuf row (rows 2 KB apart would share L1 sets)
MT_CHOICES = (32, 64, 128, 256)
NC_CHOICES = (32, 64, 128, 256, 512)
MAX_K = (2 ** 31 - 1) // (383 * 255)   # every correction term and sum fits int32
AMX_INT8, VNNI, AVX_VNNI = "amx_int8", "avx512_vnni", "avx_vnni"

Value = Callable[[Expr, Expr, Expr], Expr]       # (matrix, row or k, k or column) -> raw
Store = Callable[[Expr, Expr, Expr, Expr], None]  # (batch index, row, column, int32)
# (kb, apack, rowsum or None, i0, rows, base): apack rows base .. base+rows-1 (and their
# rowsums) = A' rows i0 .. (clamped to M-1), K padded with zeros to Kp
PackA = Callable[[KernelBuilder, Buffer, Optional[Buffer], Expr, int, Expr], None]


@dataclass(frozen=True)
class Int8Config:
    """Rows (MT) x columns (NC) of one task; both multiples of 32."""
    mt: int = 64
    nc: int = 128


def int8_space() -> list[Int8Config]:
    return [Int8Config(mt, nc) for mt, nc in itertools.product(MT_CHOICES, NC_CHOICES)]


def clamp(cfg: Int8Config, m: int, n: int) -> tuple[int, int]:
    """(MT, NC) of `cfg` no larger than the problem needs (M, N at their hint)."""
    return (min(cfg.mt, round_up(max(m, 1), ROWS)),
            min(cfg.nc, round_up(max(n, 1), PANEL)))


def default_int8(m: ExprLike, n: ExprLike, batch: int, target: CpuTarget) -> Int8Config:
    return balanced_tile(int8_space(), clamp, m, n, batch, target.cores)


def block_call(target: CpuTarget) -> str:
    """The block helper for the target's features: AMX-INT8 tiles, VNNI on zmm, AVX-VNNI
    on ymm, else the exact AVX2 `vpmaddwd` block (every cpu target has AVX2)."""
    if AMX_INT8 in target.features:
        return INT8_AMX
    if VNNI in target.features:
        return INT8_VNNI
    if AVX_VNNI in target.features:
        return INT8_AVXVNNI
    return INT8_AVX2


def int8_feature(target: CpuTarget) -> tuple[str, ...]:
    """The machine feature an int8 kernel built for `target` uses (none: AVX2 only)."""
    return tuple(f for f in (AMX_INT8, VNNI, AVX_VNNI) if f in target.features)[:1]


def pack_weights(b: np.ndarray, b_dtype: str) -> np.ndarray:
    """A constant B [K, N] (uint8 or int8) as the kernel's bpack of one matrix: int32
    [N/16 panels][Kp/4 + 1][16], B' quads (byte t of an int32 = k % 4 == t: the
    little-endian order `vpdpbusd` multiplies in) and the column sums of B' last."""
    k, n = b.shape
    kp, panels = round_up(k, K_STEP), ceil_div(n, PANEL)
    mat = np.zeros((kp, panels * PANEL), np.int8)
    mat[:k, :n] = np.asarray(b).astype(np.int32) - (128 if b_dtype == "uint8" else 0)
    quads = np.ascontiguousarray(mat.reshape(kp // 4, 4, panels, PANEL).transpose(2, 0, 3, 1))
    words = quads.view("<i4").reshape(panels, kp // 4, PANEL)
    colsum = mat.sum(axis=0, dtype=np.int32).reshape(panels, 1, PANEL)
    return np.concatenate([words, colsum], axis=1)


def packed_shape(k: ExprLike, n: ExprLike) -> tuple:
    """The shape of `pack_weights`' result for a K x N matrix."""
    return ceil_div(n, PANEL), round_up(k, K_STEP) // 4 + 1, PANEL


@dataclass(frozen=True)
class Problem:
    """`batch` problems of M x N x K: `a_count` A matrices (`a_of(bt)` the one of batch
    index bt) of dtype `a_dtype`, `b_count` B matrices (`b_of`) of `b_dtype`;
    `a_value(mat, row, k)`, `b_value(mat, k, col)` their elements (None: `b_packed`
    holds B as `pack_weights` laid it out, one matrix); `a_zero` za (an int32 expression,
    None: zero), `b_zero(col)` zb_j (None: zero). `pack_a`, when given, fills apack
    rows itself (a convolution's im2col gather, its padding = ZA: `a_pad`); where one
    task has all the columns each task gathers its own MT rows (as the bf16 GEMM)."""
    batch: tuple
    m: ExprLike
    n: ExprLike
    k: ExprLike
    a_dtype: str
    b_dtype: str
    a_count: int
    a_of: Callable[[tuple], Expr]
    a_value: Optional[Value]
    b_count: int
    b_of: Callable[[tuple], Expr]
    b_value: Optional[Value] = None
    b_packed: Optional[Buffer] = None
    a_zero: Optional[Expr] = None
    b_zero: Optional[Callable[[Expr], Expr]] = None
    pack_a: Optional[PackA] = None

    @property
    def za(self) -> Optional[Expr]:
        """ZA = za (+ 128 for an int8 A) as int32, None when it is zero."""
        offset = 128 if self.a_dtype == "int8" else 0
        if self.a_zero is None:
            return Const(offset, "int32") if offset else None
        za = cast(self.a_zero, "int32")
        return za + offset if offset else za

    @property
    def needs_rowsum(self) -> bool:
        """Whether some DB_j can be nonzero: a uint8 B or a zb."""
        return self.b_dtype == "uint8" or self.b_zero is not None

    def db(self, col: Expr) -> Expr:
        offset = Const(128 if self.b_dtype == "uint8" else 0, "int32")
        return offset - cast(self.b_zero(col), "int32") if self.b_zero is not None else offset

    def a_prime(self, value: Expr) -> Expr:
        """A' of an element of A, as int32."""
        wide = cast(value, "int32")
        return wide + 128 if self.a_dtype == "int8" else wide


def emit_int8_gemm(kb: KernelBuilder, p: Problem, cfg: Int8Config, target: CpuTarget,
                   store: Store) -> None:
    """The kernel body (see the module docstring); `store(bidx, row, col, value)` writes
    one int32 output (bidx: the batch index tuple)."""
    k_hint = hint_value(p.k)
    if k_hint > MAX_K:
        raise UnsupportedOpError(f"an int8 product over K = {k_hint} terms could overflow "
                                 f"its int32 accumulator (at most {MAX_K})")
    helper = block_call(target)
    mt, nc = clamp(cfg, hint_value(p.m), hint_value(p.n))
    kp = round_up(p.k, K_STEP)
    m_tiles, n_tiles = ceil_div(p.m, mt), ceil_div(p.n, nc)
    own_rows = p.pack_a is not None and -(-hint_value(p.n) // nc) == 1
    apack = rowsum = None
    if not own_rows:
        apack, rowsum = _pack_a(kb, p, kp) if p.pack_a is None else _gathered_a(kb, p, kp)
    bpack = p.b_packed if p.b_packed is not None else _pack_b(kb, p, kp)
    pst = (kp // 4 + 1) * PANEL
    nbatch = math.prod(p.batch)
    za = p.za
    with kb.for_range(nbatch * m_tiles * n_tiles, kind="parallel", name="p") as task:
        with kb.for_mapping(spatial(nbatch, m_tiles, n_tiles), task,
                            names=["bt", "ib", "jb"]) as (bt, ib, jb):
            bidx = tuple(unravel(bt, p.batch))
            i0, j0 = ib * mt, jb * nc
            rows, cols = minimum(p.m - i0, mt), minimum(p.n - j0, nc)
            ldc = nc + CBUF_PAD
            cbuf = kb.alloc("cbuf", "int32", (mt, ldc))
            mat_b = () if p.b_packed is not None else (p.b_of(bidx),)
            b_at = bpack[mat_b + (jb * (nc // PANEL), 0, 0)]
            if apack is None:          # the task's own rows (an im2col gather)
                own = kb.alloc("apack", "uint8", (1, mt // ROWS, kp // K_STEP, ROWS, K_STEP))
                own_sum = kb.alloc("rowsum", "int32", (1, mt)) if p.needs_rowsum else None
                p.pack_a(kb, own, own_sum, i0, mt, 0)
                a_at_, sums, row0 = own[0, 0, 0, 0, 0], own_sum, 0
            else:
                mat_a = p.a_of(bidx)
                a_at_ = apack[mat_a, ib * (mt // ROWS), 0, 0, 0]
                sums, row0 = rowsum, i0
            kb.evaluate(call(helper, a_at_, kp, b_at, pst, cbuf[0, 0], ldc, rows,
                             ceil_div(cols, PANEL), dtype="void"))
            corr = _column_terms(kb, p, bpack, mat_b, kp, j0, nc, cols, za)
            with kb.for_range(rows, name="r") as r:
                shifted = None
                if p.needs_rowsum:
                    total = sums[(0 if apack is None else mat_a), row0 + r]
                    shifted = kb.declare("shifted", "int32",
                                         total - za * p.k if za is not None else total)
                with kb.for_range(cols, name="j") as j:
                    value = cbuf[r, j]
                    if corr is not None:
                        value = value - corr[0, j]
                    if shifted is not None:
                        value = value + corr[1, j] * shifted
                    store(bidx, i0 + r, j0 + j, value)


def _column_terms(kb: KernelBuilder, p: Problem, bpack: Buffer, mat_b: tuple,
                  kp: ExprLike, j0: Expr, nc: int, cols: Expr, za: Optional[Expr]
                  ) -> Optional[Buffer]:
    """The task's per-column correction terms, once before its stores (so the store
    loop reads them contiguously and vectorizes): [0][j] = ZA * colsum_j(B'), [1][j] =
    DB_j. None when both are zero."""
    if za is None and not p.needs_rowsum:
        return None
    corr = kb.alloc("corr", "int32", (2, nc))
    with kb.for_range(cols, name="j") as j:
        col = j0 + j
        colsum = bpack[mat_b + (col // PANEL, kp // 4, col % PANEL)]
        kb.store(corr, (0, j), za * colsum if za is not None else Const(0, "int32"))
        kb.store(corr, (1, j), p.db(col) if p.needs_rowsum else Const(0, "int32"))
    return corr


def _alloc_a(kb: KernelBuilder, p: Problem, kp: ExprLike) -> tuple[Buffer, Optional[Buffer]]:
    blocks = ceil_div(p.m, ROWS)
    apack = kb.alloc("apack", "uint8", (p.a_count, blocks, kp // K_STEP, ROWS, K_STEP))
    rowsum = kb.alloc("rowsum", "int32", (p.a_count, blocks * ROWS)) if p.needs_rowsum \
        else None
    return apack, rowsum


def _pack_a(kb: KernelBuilder, p: Problem, kp: ExprLike) -> tuple[Buffer, Optional[Buffer]]:
    """apack (and rowsum): every A matrix as A', rows padded to 16 (clamped copies), K
    to Kp (zeros), in parallel over 16-row blocks."""
    apack, rowsum = _alloc_a(kb, p, kp)
    blocks = ceil_div(p.m, ROWS)
    with kb.for_range(p.a_count * blocks, kind="parallel", name="pa") as pa:
        with kb.for_mapping(spatial(p.a_count, blocks), pa, names=["mat", "rb"]) as (mat, rb):
            with kb.for_range(ROWS, name="r") as r:
                row = rb * ROWS + r
                clamped = minimum(row, p.m - 1)
                total = kb.declare("total", "int32", Const(0, "int32")) if rowsum else None
                full = p.k // K_STEP * K_STEP
                # whole tiles: 64 contiguous bytes on both sides per inner loop (it
                # vectorizes, a grafted prologue -- a QDQ model's GELU and quantize --
                # with it; one flat loop over K kept it scalar: bench/results/2026-12-07-int8.md)
                with kb.for_range(p.k // K_STEP, name="ks") as ks, \
                        kb.for_range(K_STEP, name="kk") as kk:
                    value = kb.declare("v", "int32", p.a_prime(
                        p.a_value(mat, clamped, ks * K_STEP + kk)))
                    kb.store(apack, (mat, row // ROWS, ks, row % ROWS, kk),
                             cast(value, "uint8"))
                    if total is not None:
                        kb.assign(total, total + value)
                with kb.for_range(kp - full, name="kt") as kt:   # ... then the ragged tile
                    kk = full + kt
                    value = p.a_prime(p.a_value(mat, clamped, minimum(kk, p.k - 1)))
                    value = kb.declare("v", "int32", select(kk < p.k, value, Const(0, "int32")))
                    kb.store(apack, a_at(mat, row, kk), cast(value, "uint8"))
                    if total is not None:
                        kb.assign(total, total + value)
                if rowsum is not None:
                    kb.store(rowsum, (mat, row), total)
    return apack, rowsum


def _gathered_a(kb: KernelBuilder, p: Problem, kp: ExprLike) -> tuple[Buffer, Optional[Buffer]]:
    """One apack of every row from `p.pack_a`, in parallel over 16-row blocks."""
    apack, rowsum = _alloc_a(kb, p, kp)
    with kb.for_range(ceil_div(p.m, ROWS), kind="parallel", name="rb") as rb:
        p.pack_a(kb, apack, rowsum, rb * ROWS, ROWS, rb * ROWS)
    return apack, rowsum


def a_at(mat: ExprLike, row: ExprLike, k: ExprLike) -> tuple:
    """apack's index of A'_mat[row][k]: 16 x 64 tiles, one contiguous KB each."""
    return (mat, row // ROWS, k // K_STEP, row % ROWS, k % K_STEP)


def _pack_b(kb: KernelBuilder, p: Problem, kp: ExprLike) -> Buffer:
    """bpack: every B matrix as `pack_weights` lays it out (B' quads, then the column
    sums), in parallel over panels."""
    panels, quads = ceil_div(p.n, PANEL), kp // 4
    bpack = kb.alloc("bpack", "int32", (p.b_count, panels, quads + 1, PANEL))
    shift = 128 if p.b_dtype == "uint8" else 0
    with kb.for_range(p.b_count * panels, kind="parallel", name="pb") as pb:
        with kb.for_mapping(spatial(p.b_count, panels), pb, names=["mat", "jp"]) as (mat, jp):
            with kb.for_range(PANEL, name="j") as j:
                col = jp * PANEL + j
                total = kb.declare("total", "int32", Const(0, "int32"))
                with kb.for_range(quads, name="i") as i:
                    word = kb.declare("word", "uint32", Const(0, "uint32"))
                    for t in range(4):
                        k = 4 * i + t
                        raw = p.b_value(mat, minimum(k, p.k - 1), minimum(col, p.n - 1))
                        value = select(logical_and(k < p.k, col < p.n),
                                       cast(raw, "int32") - shift, Const(0, "int32"))
                        byte = kb.declare("byte", "int32", value)
                        kb.assign(total, total + byte)
                        kb.assign(word, word + cast((byte + 256) % 256, "uint32")
                                  * Const(1 << (8 * t), "uint32"))
                    kb.store(bpack, (mat, jp, i, j), cast(word, "int32"))
                kb.store(bpack, (mat, jp, quads, j), total)
    return bpack
