"""The bf16 GEMM of the cpu target (`--precision bf16`): f32 tensors in and out, the
products' operands rounded to bf16, every sum in f32 (the ONNX op's reference with
`compute="bfloat16"`, `hidetc.graph.ops.nn`).

For `batch` independent M x N x K problems C = A x B (A and B f32 values, or B packed
at compile time), the kernel in words:

    apack[mat][Mp/16][Kp/32][16][32]  (bf16 16 x 32 tiles, `a_at`; once per call,
        parallel over 32-row blocks -- or per task, its own MT rows, for an im2col
        gather: `Problem.pack_a`): A_mat[min(row, M-1)][k] rounded to nearest even;
        zero for k >= K (Mp = M rounded up to 32, Kp = K rounded up to 32)
    bpack[mat][N/16 panels][Kp/2][16][2]  (bf16; packed at compile time when B is a
        constant -- `pack_weights` -- else once per call, parallel over panels):
        the pair-interleaved layout: (B[2i][j], B[2i+1][j]) adjacent; zero past K and N
    tasks (batch, M/MT, N/NC) in one parallel loop, each:
        cbuf[MT][NC+16] = the block helper over its rows and panels (`c_bf16`: AMX-BF16
                       tiles where the target has them, else AVX512_BF16 `vdpbf16ps`)
        store(bt, i0 + r, j0 + j, cbuf[r][j]) for the valid r, j  (the epilogues)

Rows past M are clamped on load (computed, never stored), columns past N and the K
padding are zeros in the packed operands, so any M, N, K >= 0 (and symbolic M, N: the
extents are expressions) computes exactly the reference's products and stores every
output once, after its whole K sum. The schedule's knobs (`Bf16Config`): MT rows (a
multiple of 32: two 16-row AMX tiles) x NC columns (a multiple of 32) per task; the
space is their 4 x 5 product, clamped to the problem; `default_bf16` balances the
tasks over the target's cores.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional

import ml_dtypes
import numpy as np

from hidetc.compute.injective import unravel
from hidetc.errors import UnsupportedOpError
from hidetc.graph.guards import hint_value
from hidetc.schedules.cpu.microkernel import ceil_div
from hidetc.schedules.template import CpuTarget
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.intrinsics import BF16_AMX, BF16_DP
from hidetc.tir.ir import Buffer, Const, Expr, ExprLike, call, cast, minimum, ne, select
from hidetc.tir.mapping import spatial

ROWS = 32        # apack's row padding and MT's unit: two 16-row AMX tiles
PANEL = 16       # columns of a B panel (one AMX tile, one zmm of pairs)
K_STEP = 32      # bf16 per AMX A-tile row: Kp's unit
CBUF_PAD = 16    # floats past NC in a cbuf row: rows 2 KB apart would share L1 sets
MT_CHOICES = (32, 64, 128, 256)
TILE_OUTPUTS = 64 * 128   # the default's preferred task tile (1024^3 on one core: best)
NC_CHOICES = (32, 64, 128, 256, 512)
BF16 = "bfloat16"

Value = Callable[[Expr, Expr, Expr], Expr]       # (matrix, row or k, k or column) -> f32
Store = Callable[[Expr, Expr, Expr, Expr], None]  # (batch index, row, column, value)
# (kb, apack, Kp, i0, rows, base): apack rows base .. base+rows-1 = A rows i0 .. (clamped)
PackA = Callable[[KernelBuilder, Buffer, ExprLike, Expr, int, Expr], None]


@dataclass(frozen=True)
class Bf16Config:
    """Rows (MT) x columns (NC) of one task; both multiples of 32."""
    mt: int = 64
    nc: int = 128


def bf16_space() -> list[Bf16Config]:
    return [Bf16Config(mt, nc) for mt, nc in itertools.product(MT_CHOICES, NC_CHOICES)]


def round_up(x: ExprLike, unit: int) -> ExprLike:
    return ceil_div(x, unit) * unit


def clamp(cfg: Bf16Config, m: int, n: int) -> tuple[int, int]:
    """(MT, NC) of `cfg` no larger than the problem needs (M, N at their hint)."""
    return (min(cfg.mt, round_up(max(m, 1), ROWS)),
            min(cfg.nc, round_up(max(n, 1), PANEL)))


def default_bf16(m: ExprLike, n: ExprLike, k: ExprLike, batch: int,
                 target: CpuTarget) -> Bf16Config:
    """`balanced_tile` over the bf16 space (K does not enter: every tile runs all of
    it)."""
    return balanced_tile(bf16_space(), lambda cfg, m_, n_: clamp(cfg, m_, n_), m, n, batch,
                         target.cores)


def balanced_tile(space, clamped, m: ExprLike, n: ExprLike, batch: int, cores: int):
    """The config of `space` whose busiest core computes the fewest padded products (the
    tasks split statically over `cores`), ties to the tile nearest TILE_OUTPUTS
    outputs, then to NC = 2 MT (its cbuf and A rows stay in L2 beside the B panels; the
    largest tile ran at half the rate on one core, bench/results/2026-12-07-bf16.md).
    `clamped(cfg, m, n)` is the (MT, NC) a config runs at for the problem. Symbolic
    sizes are taken at the build's hint. (The int8 GEMM shares it.)"""
    m, n = hint_value(m), hint_value(n)

    def cost(cfg) -> tuple:
        mt, nc = clamped(cfg, m, n)
        tasks = batch * -(-max(m, 1) // mt) * -(-max(n, 1) // nc)
        busiest = -(-tasks // cores)
        return (busiest * mt * nc, abs(math.log2(mt * nc / TILE_OUTPUTS)),
                abs(math.log2(nc / (2 * mt))))
    return min(space, key=cost)


def block_call(target: CpuTarget) -> str:
    """The block helper the target runs: AMX tiles where it has AMX-BF16, else
    `vdpbf16ps`; a target with neither cannot run a bf16 kernel."""
    if "amx_bf16" in target.features:
        return BF16_AMX
    if "avx512_bf16" in target.features:
        return BF16_DP
    raise UnsupportedOpError(f"a bf16 kernel needs AVX512_BF16, which the {target.describe()} "
                             f"target lacks")


def pack_weights(b: np.ndarray) -> np.ndarray:
    """A constant B [K, N] (f32) as the kernel's bpack of one matrix: [N/16 panels]
    [Kp/2][16][2] bf16 (rounded to nearest even), zero past K and N."""
    k, n = b.shape
    kp, panels = round_up(k, K_STEP), ceil_div(n, PANEL)
    mat = np.zeros((kp, panels * PANEL), np.float32)
    mat[:k, :n] = b
    pairs = mat.reshape(kp // 2, 2, panels, PANEL).transpose(2, 0, 3, 1)
    return np.ascontiguousarray(pairs).astype(ml_dtypes.bfloat16)


def packed_shape(k: ExprLike, n: ExprLike) -> tuple:
    """The shape of `pack_weights`' result for a K x N matrix."""
    return ceil_div(n, PANEL), round_up(k, K_STEP) // 2, PANEL, 2


@dataclass(frozen=True)
class Problem:
    """`batch` problems of M x N x K: `a_count` A matrices (`a_of(bt)` the one of batch
    index bt), `b_count` B matrices (`b_of`), `a_value(mat, row, k)`, `b_value(mat, k,
    col)` (None: `b_packed` holds B as `pack_weights` laid it out, one matrix).
    `pack_a(kb, apack, kp, i0, rows, base)`, when given, fills apack rows base ..
    base+rows-1 with A's rows i0 .. (clamped to M-1) instead of `a_value` per element:
    a convolution's im2col gather. Where one task has all the columns, each task
    gathers its own MT rows into its own apack [1][MT/16][Kp/32][16][32] (K = KH*KW*C
    columns make a whole-matrix apack too big for the caches: packed before the tasks,
    it went to memory and back); otherwise every row is gathered once before them."""
    batch: tuple
    m: ExprLike
    n: ExprLike
    k: ExprLike
    a_count: int
    a_of: Callable[[tuple], Expr]
    a_value: Value
    b_count: int
    b_of: Callable[[tuple], Expr]
    b_value: Optional[Value] = None
    b_packed: Optional[Buffer] = None
    pack_a: Optional[PackA] = None


def emit_bf16_gemm(kb: KernelBuilder, p: Problem, cfg: Bf16Config, target: CpuTarget,
                   store: Store) -> None:
    """The kernel body (see the module docstring); `store(bidx, row, col, value)` writes
    one output (bidx: the batch index tuple)."""
    helper = block_call(target)
    mt, nc = clamp(cfg, hint_value(p.m), hint_value(p.n))
    kp = round_up(p.k, K_STEP)
    m_tiles = ceil_div(p.m, mt)
    n_tiles = ceil_div(p.n, nc)
    # a gather per task where each task has all the columns (else it would repeat)
    own_rows = p.pack_a is not None and -(-hint_value(p.n) // nc) == 1
    apack = None if own_rows else _pack_a(kb, p, kp) if p.pack_a is None else \
        _gathered_a(kb, p, kp)
    bpack = p.b_packed if p.b_packed is not None else _pack_b(kb, p, kp)
    nbatch = math.prod(p.batch)
    with kb.for_range(nbatch * m_tiles * n_tiles, kind="parallel", name="p") as task:
        with kb.for_mapping(spatial(nbatch, m_tiles, n_tiles), task,
                            names=["bt", "ib", "jb"]) as (bt, ib, jb):
            bidx = tuple(unravel(bt, p.batch))
            i0, j0 = ib * mt, jb * nc
            rows, cols = minimum(p.m - i0, mt), minimum(p.n - j0, nc)
            panels = ceil_div(cols, PANEL)
            ldc = nc + CBUF_PAD
            cbuf = kb.alloc("cbuf", "float32", (mt, ldc))
            b_at = (bpack[jb * (nc // PANEL), 0, 0, 0] if p.b_packed is not None else
                    bpack[p.b_of(bidx), jb * (nc // PANEL), 0, 0, 0])
            if apack is None:          # the task's own rows (an im2col gather)
                own = kb.alloc("apack", BF16, (1, mt // 16, kp // K_STEP, 16, K_STEP))
                p.pack_a(kb, own, kp, i0, mt, 0)
                a_at_ = own[0, 0, 0, 0, 0]
            else:
                a_at_ = apack[p.a_of(bidx), ib * (mt // 16), 0, 0, 0]
            kb.evaluate(call(helper, a_at_, kp, b_at,
                             kp // 2 * (2 * PANEL), cbuf[0, 0], ldc, rows, panels, kp,
                             dtype="void"))
            with kb.for_range(rows, name="r") as r, kb.for_range(cols, name="j") as j:
                store(bidx, i0 + r, j0 + j, cbuf[r, j])


def _pack_a(kb: KernelBuilder, p: Problem, kp: ExprLike) -> Buffer:
    """apack: every A matrix rounded to bf16, rows padded to 32 (clamped copies), K to
    Kp (zeros). The whole 32-wide K chunks are plain copies, contiguous on both sides
    (gcc vectorizes them); only a ragged last chunk checks k < K."""
    apack = _alloc_a(kb, p, kp)
    blocks = ceil_div(p.m, ROWS)
    full = p.k // K_STEP
    with kb.for_range(p.a_count * blocks, kind="parallel", name="pa") as pa:
        with kb.for_mapping(spatial(p.a_count, blocks), pa, names=["mat", "rb"]) as (mat, rb):
            with kb.for_range(ROWS, name="r") as r:
                row = rb * ROWS + r
                clamped = minimum(row, p.m - 1)
                with kb.for_range(full, name="ks") as ks, \
                        kb.for_range(K_STEP, name="kk") as kk:
                    kb.store(apack, (mat, row // 16, ks, row % 16, kk),
                             cast(p.a_value(mat, clamped, ks * K_STEP + kk), BF16))
                if isinstance(p.k, int):
                    if p.k % K_STEP:
                        _tail(kb, p, apack, (mat, row, clamped), full)
                else:                  # a symbolic K: the tail chunk only where ragged
                    with kb.if_then(ne(p.k % K_STEP, 0)):
                        _tail(kb, p, apack, (mat, row, clamped), full)
    return apack


def _gathered_a(kb: KernelBuilder, p: Problem, kp: ExprLike) -> Buffer:
    """One apack of every row from `p.pack_a`, in parallel over 32-row blocks (a
    gather whose tasks split the columns: each row is gathered once, not per task)."""
    apack = _alloc_a(kb, p, kp)
    with kb.for_range(ceil_div(p.m, ROWS), kind="parallel", name="rb") as rb:
        p.pack_a(kb, apack, kp, rb * ROWS, ROWS, rb * ROWS)
    return apack


def _tail(kb: KernelBuilder, p: Problem, apack: Buffer, at: tuple, full: ExprLike) -> None:
    """The ragged last K chunk of one row: A where k < K, zero after."""
    mat, row, clamped = at
    with kb.for_range(K_STEP, name="kt") as kt:
        k = full * K_STEP + kt
        value = p.a_value(mat, clamped, minimum(k, p.k - 1))
        kb.store(apack, (mat, row // 16, full, row % 16, kt),
                 cast(select(k < p.k, value, Const(0.0, "float32")), BF16))


def _alloc_a(kb: KernelBuilder, p: Problem, kp: ExprLike) -> Buffer:
    return kb.alloc("apack", BF16, (p.a_count, ceil_div(p.m, ROWS) * 2, kp // K_STEP,
                                    16, K_STEP))


def a_at(mat: ExprLike, row: ExprLike, k: ExprLike) -> tuple:
    """apack's index of A_mat[row][k]: 16 x 32 tiles, one contiguous KB each."""
    return (mat, row // 16, k // K_STEP, row % 16, k % K_STEP)


def _pack_b(kb: KernelBuilder, p: Problem, kp: ExprLike) -> Buffer:
    """bpack: every B matrix in the pair-interleaved panels of `pack_weights`, rounded
    to bf16, zero past K and N."""
    panels = ceil_div(p.n, PANEL)
    bpack = kb.alloc("bpack", BF16, (p.b_count, panels, kp // 2, PANEL, 2))
    zero = Const(0.0, "float32")
    with kb.for_range(p.b_count * panels, kind="parallel", name="pb") as pb:
        with kb.for_mapping(spatial(p.b_count, panels), pb, names=["mat", "jp"]) as (mat, jp):
            with kb.for_range(kp // 2, name="i") as i, \
                    kb.for_range(PANEL, name="j") as j, kb.for_range(2, name="t") as t:
                k, col = 2 * i + t, jp * PANEL + j
                value = p.b_value(mat, minimum(k, p.k - 1), minimum(col, p.n - 1))
                kb.store(bpack, (mat, jp, i, j, t),
                         cast(select(k < p.k, select(col < p.n, value, zero), zero), BF16))
    return bpack
