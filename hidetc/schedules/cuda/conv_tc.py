"""CUDA template: float16 or bfloat16 2-D convolution in NHWC (`ConvNHWC`, introduced
by the `choose_layout` graph pass) as an implicit GEMM on tensor cores (mma.sync
m16n8k16 of that type, f32 accumulation). sm_80 and newer.

The GEMM, per group g (grid z): C[M, N] = A[M, K] @ B[K, N] with
- M = batch * OH * OW output pixels: row m = (n, oh, ow) row-major, so C is the NHWC
  output viewed [M, OC] (column g * OC/G + col): the epilogue's stores are contiguous;
- N = OC / G output channels of the group;
- K = KH * KW * C/G, ordered (kh, kw, c): A[m, k] = X[n, oh*sh - ph + kh*dh,
  ow*sw - pw + kw*dw, g*C/G + c] (zero in the padding) is the im2col matrix, never
  materialized: it is gathered chunk by chunk by the tile loads (an injective
  prologue of the GEMM); B^T = the OHWI weights viewed [OC, K], a plain row-major
  matrix whose rows are output channels.

Schedule: `tc_common.TcKernel` (the pipeline, swizzle, fragments and epilogue of
`matmul_tc`, which documents them), with these operand specifics:
- A tile (BM x BK, swizzled like MatMul's): thread chunks `chunk_mapping(BM, BK/8)`.
  When C/G is a multiple of 8, a 16-byte chunk (8 consecutive k) is 8 consecutive input
  channels of ONE input pixel (one (kh, kw) tap), contiguous and 16-byte aligned in
  NHWC: one `cp.async` 16. Its predicate is m < M, k < K and the tap inside the input
  (0 <= ih < H, 0 <= iw < W); when false cp.async zero-fills the chunk (padding, tile
  tails), and the address is formed from m, k, ih, iw CLAMPED into range, so no address
  outside X is ever formed. Checks that cannot fail for the shape (no top padding, K a
  multiple of BK, ...) are left out at build time. Other C/G (the graph pass never
  emits them, but the template is correct on every shape) split each chunk into pieces
  of the widest size dividing C/G (cp.async 8 / 4, or predicated scalar loads), each
  piece within one tap.
- B tile: stored [n][k] (BN x BK, rows = output channels, swizzled the same way), loaded
  exactly like a MatMul A tile from the [OC, K] weight matrix (predicate n < N, k < K).
  Fragments by plain `ldmatrix.x4` (no .trans): an 8x8 [n][k] matrix gives lane l the
  pair (n = l // 4, k = 2 (l % 4) + {0, 1}), which IS the mma "col" B fragment; lane l
  addresses row l % 8 of matrix l // 8 = (n half (l // 16), k chunk (l // 8) % 2), so
  the four registers are b0, b1 of n tile j and b0, b1 of n tile j + 1
  (`tc_common.B_NK_X4`).
- epilogue: the accumulator plus the optional bias (f32), rounded to the half type once,
  stored
  predicated on m < M and n < N; column pairs as one 4-byte store when OC/G is even.
- grid: (M tiles, N tiles, G): M tiles on x (no 65535 limit for large images).

Space: `tc_common.tc_space` (shape-independent, the MatMul space; the tile shapes are
the same, A and B^T tiles use BM x BK and BN x BK halves: same shared memory).

Assumes: X, W, bias and output of one half type (float16 or bfloat16); buffers 16-byte
aligned (arena and weights
are 64-byte aligned); 2-D convolution, pads resolved. Guarantees: correct for every
config on every shape (any C/G, OC/G, stride, dilation, padding, group count).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.schedules.cuda import cost, split_k
from hidetc.schedules.cuda.common import at_least_one, ceil_div
from hidetc.schedules.cuda.matmul_tc import DEFAULTS
from hidetc.schedules.cuda.tc_common import (
    CHUNK,
    F32,
    HALVES,
    TcConfig,
    TcKernel,
    chunk_mapping,
    copy_width,
    cuda_target,
    half_operands,
    tc_space,
)
from hidetc.schedules.template import Target
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Expr, Function, block_idx, cast, logical_and, maximum, minimum


@dataclass(frozen=True)
class ConvGeometry:
    n: int
    h: int
    w: int
    c: int
    oc: int
    kh: int
    kw: int
    oh: int
    ow: int
    group: int
    strides: tuple[int, int]
    dilations: tuple[int, int]
    begin: tuple[int, int]         # top, left pads

    @property
    def cg(self) -> int:
        return self.c // self.group

    @property
    def ocg(self) -> int:
        return self.oc // self.group

    @property
    def m(self) -> int:
        return self.n * self.oh * self.ow

    @property
    def k(self) -> int:
        return self.kh * self.kw * self.cg

    def may_leave(self, axis: int) -> tuple[bool, bool]:
        """Whether a tap on spatial `axis` (0: h, 1: w) can fall before / past the input."""
        size, out, ker = (self.h, self.oh, self.kh) if axis == 0 else (self.w, self.ow, self.kw)
        last = (out - 1) * self.strides[axis] - self.begin[axis] + (ker - 1) * self.dilations[axis]
        return self.begin[axis] > 0, last >= size


def conv_geometry(task: Task) -> ConvGeometry:
    n, h, w, c = task.inputs[0].shape
    oc, kh, kw, _ = task.inputs[1].shape
    _, oh, ow, _ = task.outputs[0].shape
    pads = task.attr("pads") or (0, 0, 0, 0)
    return ConvGeometry(n, h, w, c, oc, kh, kw, oh, ow, task.attr("group", 1),
                        tuple(task.attr("strides") or (1, 1)),
                        tuple(task.attr("dilations") or (1, 1)), (pads[0], pads[1]))


class _ConvKernel(TcKernel):
    """ConvNHWC buffers, the im2col A-tile gather, the weight B^T tile and the epilogue."""

    b_nk = True

    def __init__(self, task: Task, cfg: TcConfig, name: str):
        self.geo = geo = conv_geometry(task)
        dt = check_task(task)
        kb = KernelBuilder(name, "cuda")
        self.x = kb.buffer("x", dt, (geo.n, geo.h, geo.w, geo.c))
        self.wt = kb.buffer("w", dt, (geo.oc, geo.k))
        self.bias = kb.buffer("bias", dt, (geo.oc,)) if 2 in task.buffer_inputs else None
        self.out = kb.buffer("out", dt, (geo.m, geo.oc))
        grid = (at_least_one(ceil_div(geo.m, cfg.bm)), at_least_one(ceil_div(geo.ocg, cfg.bn)),
                at_least_one(geo.group))
        super().__init__(kb, cfg, geo.m, geo.ocg, geo.k, grid, dt)
        self.g = self.outer
        self.m0, self.n0 = block_idx("x") * cfg.bm, block_idx("y") * cfg.bn
        self.pairs = geo.ocg % 2 == 0
        self.width = copy_width(geo.cg)

    # global -> shared ---------------------------------------------------------------
    def load_tile(self, stage: int | Expr, kt: int | Expr) -> None:
        cfg, kb = self.cfg, self.kb
        k0 = kt * cfg.bk
        ta, tb = self.tile_a, self.tile_b
        with kb.for_mapping(chunk_mapping(cfg.bm, ta.chunks, cfg.threads), self.tid,
                            names=("r", "c")) as (r, c):
            self.load_a_chunk(stage * ta.size + ta.offset(r, c), self.m0 + r, k0 + c * CHUNK)
        with kb.for_mapping(chunk_mapping(cfg.bn, tb.chunks, cfg.threads), self.tid,
                            names=("r", "c")) as (r, c):
            self.load_b_chunk(stage * tb.size + tb.offset(r, c), self.n0 + r, k0 + c * CHUNK)

    def k_ok(self, k: Expr) -> list[Expr]:
        return [k < self.k] if self.k % self.cfg.bk else []

    def load_a_chunk(self, dst_off: Expr, m: Expr, k: Expr) -> None:
        """A[m, k .. k + 8) (im2col of X) into sa[dst_off ..), zero outside."""
        geo, kb, width = self.geo, self.kb, self.width
        m_ok = [m < geo.m] if geo.m % self.cfg.bm else []
        mc = kb.declare("mc", "int32", minimum(m, geo.m - 1) if m_ok else m)
        ow = kb.declare("ow", "int32", mc % geo.ow)
        rest = kb.declare("rest", "int32", mc // geo.ow)
        ih0 = kb.declare("ih0", "int32", (rest % geo.oh) * geo.strides[0] - geo.begin[0])
        iw0 = kb.declare("iw0", "int32", ow * geo.strides[1] - geo.begin[1])
        img = rest // geo.oh
        pieces = []
        for p in range(CHUNK // width):
            kp = k + p * width if p else k
            k_ok = self.k_ok(kp)
            kc = minimum(kp, self.k - width) if k_ok else kp
            tap = kc // geo.cg
            ih = ih0 + (tap // geo.kw) * geo.dilations[0]
            iw = iw0 + (tap % geo.kw) * geo.dilations[1]
            conds = m_ok + k_ok
            ih, conds = self.inside(ih, geo.h, geo.may_leave(0), conds)
            iw, conds = self.inside(iw, geo.w, geo.may_leave(1), conds)
            element = self.x[img, ih, iw, self.g * geo.cg + kc % geo.cg]
            pieces.append((logical_and(*conds) if conds else True, element))
        self.copy_pieces(self.sa, dst_off, width, pieces)

    def inside(self, i: Expr, size: int, leave: tuple[bool, bool],
               conds: list[Expr]) -> tuple[Expr, list[Expr]]:
        """(i clamped into [0, size), conds + the checks that it was) for the checks
        `leave` = (may fall before, may fall past) says are needed."""
        before, past = leave
        if before:
            conds, i = conds + [i >= 0], maximum(i, 0)
        if past:
            conds, i = conds + [i < size], minimum(i, size - 1)
        return i, conds

    def load_b_chunk(self, dst_off: Expr, o: Expr, k: Expr) -> None:
        """B^T[o, k .. k + 8) (weights row g * N + o) into sb[dst_off ..), zero outside."""
        geo, width = self.geo, self.width
        o_ok = [o < geo.ocg] if geo.ocg % self.cfg.bn else []
        row = self.g * geo.ocg + (minimum(o, geo.ocg - 1) if o_ok else o)
        pieces = []
        for p in range(CHUNK // width):
            kp = k + p * width if p else k
            k_ok = self.k_ok(kp)
            kc = minimum(kp, self.k - width) if k_ok else kp
            conds = o_ok + k_ok
            pieces.append((logical_and(*conds) if conds else True, self.wt[row, kc]))
        self.copy_pieces(self.sb, dst_off, width, pieces)

    # registers -> global ------------------------------------------------------------
    def out_element(self, row: Expr, col: Expr) -> Expr:
        return self.out[row, self.g * self.geo.ocg + col]

    def out_value(self, acc: Expr, col: Expr) -> Expr:
        if self.bias is None:
            return cast(acc, self.dtype)
        return cast(acc + cast(self.bias[self.g * self.geo.ocg + col], F32), self.dtype)

    def launch(self) -> Function:
        return self.finish(operand_bytes(self.geo, self.bias is not None))


def check_task(task: Task) -> str:
    """The half type of a 2-D ConvNHWC the tensor cores take (every operand float16, or
    every one bfloat16); a ValueError for another task."""
    types = [t for t in (*task.inputs, task.outputs[0]) if t is not None]
    dtype = half_operands({t.dtype for t in types})
    if task.op != "ConvNHWC" or dtype is None or len(task.inputs[0].shape) != 4:
        raise ValueError(f"the tensor-core convolution takes 2-D ConvNHWC in one of "
                         f"{', '.join(HALVES)}, got {task.signature()}")
    return dtype


def build_tc_conv(task: Task, cfg: TcConfig, name: str) -> Function:
    check_task(task)
    kernel = _ConvKernel(task, cfg, name)
    if task.outputs[0].size > 0:    # else nothing to compute (and no row to clamp loads to)
        kernel.run()
    return kernel.launch()


def operand_bytes(geo, bias: bool) -> int:
    return 2 * (geo.n * geo.h * geo.w * geo.c + geo.oc * geo.k + (geo.oc if bias else 0))


def cost_gemm(task: Task) -> cost.Gemm:
    """The implicit GEMM the cost model sees: per group M x OC/G x K."""
    geo = conv_geometry(task)
    return cost.Gemm(geo.m, geo.ocg, geo.k, max(1, geo.group),
                     operand_bytes(geo, 2 in task.buffer_inputs))


def default_config(task: Task, target: Target) -> TcConfig:
    """The cost model's cheapest of matmul_tc's DEFAULTS, each at its cheapest split-K."""
    return cost.gemm_choice(cost_gemm(task), DEFAULTS, cuda_target(target))


class TensorCoreConv:
    name = "cuda.conv_tc"
    precisions = ("f16", "bf16")

    def space(self, task: Task, target: Target) -> Sequence[TcConfig]:
        return cost.task_space(cost_gemm(task) if task is not None else None,
                               tc_space(target), cuda_target(target))

    def default(self, task: Task, target: Target) -> TcConfig:
        return default_config(task, target)

    over_range = staticmethod(split_k.unsplit)   # (the batch sizes split-K's tiles)

    def build(self, task: Task, config: TcConfig, name: str, target: Target) -> Function:
        return build_tc_conv(task, config, name)


def check_supported(task: Task) -> None:
    """A ConvNHWC that is not float16 or bfloat16 (only `choose_layout` makes ConvNHWC,
    and it does so for f16 and bf16 compilations) is a user-facing UnsupportedOpError,
    not a crash."""
    try:
        check_task(task)
    except ValueError as error:
        raise UnsupportedOpError(f"ConvNHWC: {error}") from None


TEMPLATE = TensorCoreConv()
