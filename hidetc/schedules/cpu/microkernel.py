"""The blocked GEMM shared by the CPU MatMul and Conv templates (f32, AVX2/FMA).

One *task* computes the block C[i0 : i0+rows, j0 : j0+cols] of an M x N x K product
C = A x B (the callers run tasks in parallel, one OpenMP iteration each; rows <= MT,
cols <= NC). The schedule of a task, in words (BLIS's loop order):

    cbuf[MT][NCW]                     local: the task's accumulators across K blocks
    for each K block k0 (KC deep):
        pack B:  bpack[k][j] = B[k0+k][j0+j] for j < cols (the caller's `pack_b`: a
                 row copy for MatMul, the im2col gather for Conv); columns up to the
                 next multiple of NR are zero. Row stride NCP = an odd number of cache
                 lines, so one NR-wide panel (KC lines) spreads over all L1 sets.
        for each MC-row block of the task (A's L2 block; B's block is packed once):
            for jp over the NR-wide column panels, ip over the MR-high row panels:
                micro-kernel: acc[MR][NR] = 0 (MR * NR/L vector registers); for k < kcur:
                    acc[r][j] = fma(A(r, k), bpack[k][jp*NR + j], acc[r][j])
                    cbuf tile = acc on the first K block, cbuf tile += acc after
                (a ragged last panel with at most L columns left runs an MR x L kernel)
    store:  for r < rows, j < cols: the caller's `store(r, j, cbuf[r][j])`

A is read through `a_panel`: with pack_a, `packed_a` has copied every A matrix once per
call, before the tasks (a parallel loop of its own), into MR-row panels
apack[mat][panel][k][r] = A[min(panel*MR + r, M-1)][k] -- so tasks never repack A;
with pack_a=False the micro-kernel broadcasts straight from A (rows clamped).

Rows past M are clamped on load (their results are computed and dropped), columns
past N are zero in bpack, the last K block is `min(KC, K - k0)` deep: any M, N, K >= 0
works and nothing is read or written out of bounds. Every output element is stored
exactly once, after its whole K sum (so epilogues can be grafted on the store).

The f32 micro-kernel is written in AVX2/FMA or AVX-512 intrinsics (`avx2.py`, the ISA of
the target, `Blocking.lanes` L = 8 or 16: one IR variable per accumulator register, printed
as `__m256` / `__m512`), so gcc allocates its registers exactly; other
float dtypes use the scalar form below (r and v unrolled around a plain 8-lane loop,
acc starting at zero and leaving through a cbuf store -- the one shape gcc 12's
vectorizer keeps in registers, and even then not for every shape: some made it
scalar-replace acc into scalar FMAs with spills). tests/schedules/test_cpu_templates.py
checks the FMA loop's assembly. Both forms compute the same values (fma from zero
over a K block, then one add into cbuf). Tile sizes are config knobs (`GemmConfig`);
`task_shape.blocking` clamps them to the problem (MR to M: a 1-row GEMV computes no row
twice) and picks the task shape (MT rows x NC columns) that balances the tasks over the
cores while repacking the least. Packed and cbuf buffers are 64-byte aligned (the C
printer's malloc), so a 16-wide B row is one cache line, not two.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable, Optional

from hidetc.cpu_isa import ISAS
from hidetc.schedules.cpu import avx2
from hidetc.schedules.cpu.task_shape import Blocking
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Const, Expr, ExprLike, call, eq, minimum
from hidetc.tir.mapping import spatial

# per ISA name (`CpuTarget.isa`): the MR x NR micro-tiles that fill its register file
MICRO_SHAPES = {name: isa.micro_shapes for name, isa in ISAS.items()}
PLAIN_LANES = 8   # the scalar form's inner loop (other dtypes): gcc vectorizes it
MC_CHOICES = (32, 64, 128)
NC_CHOICES = (96, 192, 384)
KC_CHOICES = (128, 256, 512)

AValue = Callable[[Expr, Expr], Expr]             # (row < M, k < K) -> A[row, k]
APanel = Callable[[Expr, Expr, Expr], Expr]       # (row panel, r < MR, k) -> A value
BValue = Callable[[Expr, Expr], Expr]             # (k, column in the task) -> B value
PackB = Callable[[KernelBuilder, Buffer, Expr, ExprLike, ExprLike], None]
# (kb, bpack, k0, kcur, c_from): fill bpack[0:kcur][c_from:cols]
Store = Callable[[Expr, Expr, Expr], None]       # (r, j, value) within the task
BPanel = Callable[[Expr, Expr, Expr], Expr]       # (k, panel of the task, j < NR) -> B


@dataclass(frozen=True)
class GemmConfig:
    """Knobs of the blocked GEMM: micro-kernel MR x NR, cache blocks MC, NC, KC, whether
    A is packed into MR-row panels, and whether B is packed (pack_b=False: full NR-wide
    panels are read in place where B's rows are contiguous -- MatMul, 1x1 convs --
    only the ragged last panel is packed; the im2col gather always packs)."""
    mr: int = 5
    nr: int = 16
    mc: int = 64
    nc: int = 384
    kc: int = 256
    pack_a: bool = True
    pack_b: bool = True


def gemm_space(isa: str) -> list[GemmConfig]:
    """Every micro-kernel shape of the ISA x cache block with A and B packed (6 * 27 =
    162), and every shape x NC with A read in place (18) or B read in place (18): 198
    configs, the same for every shape."""
    shapes = MICRO_SHAPES[isa]
    out = [GemmConfig(mr, nr, mc, nc, kc)
           for (mr, nr), mc, nc, kc in itertools.product(shapes, MC_CHOICES,
                                                           NC_CHOICES, KC_CHOICES)]
    for (mr, nr), nc in itertools.product(shapes, NC_CHOICES):
        out.append(GemmConfig(mr, nr, 64, nc, 256, pack_a=False))
        out.append(GemmConfig(mr, nr, 64, nc, 256, pack_b=False))
    return out


# The tuner's short list (`search.candidates`, space level 1) after the default: configs
# that won on some shape in a sweep of the whole packed space with weights packed at
# compile time, where no one config won everywhere (the sweep:
# bench/results/2026-12-06-decision-notes.md). AVX-512 (not swept yet): the
# register-filling tiles at the same cache blocks.
SHORT_LIST = {
    "avx2": (GemmConfig(6, 16, 64, 192, 256), GemmConfig(4, 24, 128, 96, 128),
             GemmConfig(6, 16, 128, 96, 128), GemmConfig(4, 16, 64, 192, 256),
             GemmConfig(3, 32, 128, 384, 128), GemmConfig(6, 16, 128, 192, 256),
             GemmConfig(4, 24, 64, 192, 256)),
    "avx512": (GemmConfig(12, 32, 64, 192, 256), GemmConfig(8, 48, 128, 96, 128),
               GemmConfig(14, 32, 128, 96, 128), GemmConfig(8, 32, 64, 192, 256),
               GemmConfig(4, 64, 128, 384, 128), GemmConfig(12, 32, 128, 192, 256),
               GemmConfig(6, 48, 64, 192, 256))}


def default_gemm(m: int, n: int, isa: str, one_packing: bool = False) -> GemmConfig:
    """The untuned choice for an M x N output: a 5 x 16 micro-kernel (10 accumulators:
    more than 4 x 16's 8 to hide the FMA latency; 6 x 16 measured no faster in these
    kernels, and costs more when M is not a multiple of 6); NC up
    to 384 so `blocking` may choose whole-N tiles. A is packed once per call only when
    each row panel feeds enough columns (N >= 256); for narrow N (the 7x7 layers,
    N = 49) it is read in place, since packing it would cost about as much as the FMAs
    it feeds. For M <= 4 (GEMV-like): 3 x 32 (MR clamped to M by `blocking`) with B
    read in place (packing would copy all of B to use each element once; the wider
    panel reads two cache lines per B row instead of one). AVX-512: 8 x 32 (16
    accumulators), 3 x 64 for M <= 4. `one_packing` (a range compile's dispatch
    variants): M <= 4 takes the larger M's panel width too (3 x 32 on AVX-512, 3 x 16 on
    AVX2), so a weight packed at compile time is stored once for every size -- a
    GEMV-like M reads each weight once and is bound by memory, not by the FMA chains the
    wider panel adds (BERT-base seq 1..512 had every MatMul weight in both widths: +340
    MB; seq 1 ran as fast either way, bench/results/2026-12-07-dynamic-shapes.md)."""
    if isa == "avx512":
        if m <= 4:
            return GemmConfig(3, 32 if one_packing else 64, 64, 384, 256, pack_b=False)
        return GemmConfig(8, 32, 64, 384, 256, pack_a=n >= 256)
    if m <= 4:
        return GemmConfig(3, 16 if one_packing else 32, 64, 384, 256, pack_b=False)
    return GemmConfig(5, 16, 64, 384, 256, pack_a=n >= 256)


def tile_extent(total: ExprLike, start: Expr, block: int) -> ExprLike:
    """Rows/columns of the block starting at `start`: a constant when blocks divide a
    constant total."""
    if isinstance(total, int) and total % block == 0:
        return block
    return minimum(total - start, block)


def ceil_div(x: ExprLike, d: int) -> ExprLike:
    return -(-x // d) if isinstance(x, int) else (x + (d - 1)) // d


def packed_a(kb: KernelBuilder, bl: Blocking, dt: str, count: int,
             a_value: Callable[[Expr, Expr, Expr], Expr]) -> Callable[[ExprLike], APanel]:
    """Pack `count` A matrices once per call, before the tasks, in parallel over
    (matrix, MR-row panel): apack[mat][panel][k][r] = A_mat[min(panel*MR + r, M-1)][k]
    with `a_value(mat, row, k)`. Returns `mat -> APanel` for `emit_gemm_tile`."""
    panels = -(-max(bl.m, 1) // bl.mr)
    apack = kb.alloc("apack", dt, (count, panels, max(bl.k, 1), bl.mr))
    with kb.for_range(count * panels, kind="parallel", name="pa") as pa:
        with kb.for_mapping(spatial(count, panels), pa, names=["mat", "ip"]) as (mat, ip):
            with kb.for_range(bl.k, name="k") as k, \
                    kb.for_range(bl.mr, kind="unroll", name="r") as r:
                row = minimum(ip * bl.mr + r, bl.m - 1)
                kb.store(apack, (mat, ip, k, r), a_value(mat, row, k))
    return lambda mat: (lambda panel, r, k: apack[mat, panel, k, r])


def direct_a(bl: Blocking, a_value: AValue) -> APanel:
    """An APanel that reads A in place: A[min(panel*MR + r, M-1)][k] (pack_a=False)."""
    return lambda panel, r, k: a_value(minimum(panel * bl.mr + r, bl.m - 1), k)


def emit_gemm_tile(kb: KernelBuilder, bl: Blocking, dt: str, i0: Expr, extent: tuple,
                   a_panel: APanel, pack_b: Optional[PackB], store: Store,
                   b_direct: Optional[BValue] = None,
                   b_prepacked: Optional[BPanel] = None) -> None:
    """Compute and store one task: `extent` = (rows, cols) outputs from row i0 (a
    multiple of MR; see the module docstring). `pack_b(kb, bpack, k0, kcur, c_from)`
    fills bpack[0:kcur][c_from:cols]; `a_panel(panel, r, k)` reads A's row
    panel*MR + r (clamped) at column k; `b_direct(k, col)`, when given and the config
    has pack_b=False, reads B in place for the full NR-wide panels. `b_prepacked(k,
    jp, j)`, when given, reads every panel (the ragged last one zero-padded) from B
    packed ahead of time: nothing is packed at all."""
    rows, cols = extent
    if bl.k == 0:
        with kb.for_range(rows, name="r") as r, kb.for_range(cols, name="j") as j:
            store(r, j, Const(0.0, dt))
        return
    direct = b_direct if not bl.pack_b and b_prepacked is None else None
    full = cols // bl.nr if direct is not None else 0
    cbuf = kb.alloc("cbuf", dt, (bl.mt, bl.ncw))
    bpack = None
    if b_prepacked is None:
        bpack = kb.alloc("bpack", dt, (bl.kc, bl.ncp))
        _zero_tail(kb, bl, bpack, cols)
    with kb.for_range(bl.k_blocks, name="kb") as kblk:
        k0 = kblk * bl.kc
        kcur = bl.kc if bl.k % bl.kc == 0 else minimum(bl.k - k0, bl.kc)
        if b_prepacked is None:
            pack_b(kb, bpack, k0, kcur, full * bl.nr)
        step = _Step(kblk, k0, kcur, cbuf, bpack, direct, full, cols, b_prepacked)
        with kb.for_range(ceil_div(rows, bl.mc), name="ib") as ib:
            i1 = ib * bl.mc
            brows = rows if bl.mt == bl.mc else minimum(rows - i1, bl.mc)
            with kb.for_range(ceil_div(cols, bl.nr), name="jp") as jp, \
                    kb.for_range(ceil_div(brows, bl.mr), name="ip") as ip:
                panel = (i0 + i1) // bl.mr + ip
                _panel(kb, bl, dt, step, lambda r, k, panel=panel: a_panel(panel, r, k0 + k),
                       (i1 + ip * bl.mr, jp), _ahead(kb, bl, step, cols, jp, ip))
    with kb.for_range(rows, name="r") as r, kb.for_range(cols, name="j") as j:
        store(r, j, cbuf[r, j])


@dataclass(frozen=True)
class _Step:
    """One K block of a task: its index, start, depth, and where B comes from."""
    kblk: Expr
    k0: Expr
    kcur: ExprLike
    cbuf: Buffer
    bpack: Optional[Buffer]
    direct: Optional[BValue]
    full: ExprLike
    cols: ExprLike
    prepacked: Optional["BPanel"] = None


def _ahead(kb: KernelBuilder, bl: Blocking, step: _Step, cols: ExprLike, jp: Expr,
           ip: Expr) -> Optional[avx2.Ahead]:
    """The prefetch of B panels packed ahead of time (weights, read from memory once
    per pass; `avx2.ahead_of_panels`), rows clamped to K."""
    if step.prepacked is None:
        return None
    return avx2.ahead_of_panels(
        kb, ip, jp, ceil_div(cols, bl.nr), step.k0, step.k0 + bl.kc,
        lambda k, panel, j: step.prepacked(minimum(k, bl.k - 1), panel, j))


def _panel(kb: KernelBuilder, bl: Blocking, dt: str, step: _Step,
           av: Callable[[Expr, Expr], Expr], at: tuple,
           ahead: Optional[avx2.Ahead] = None) -> None:
    """One micro-kernel call into cbuf at (row r0, column panel jp); with B read in
    place, full panels take it from B and the ragged last one from bpack. A packed
    panel with at most L (the target's lanes) columns left (the ragged last one) runs an
    MR x L kernel. `ahead`: B rows to prefetch alongside (only with panels packed ahead of
    time, which every panel then reads)."""
    r0, jp = at
    c0 = jp * bl.nr

    def run(bv: Callable[[Expr, Expr], Expr], nr: int) -> None:
        if dt == "float32":
            acc = avx2.micro_kernel(kb, bl.mr, nr, bl.lanes, step.kcur, av, bv, ahead)
            avx2.accumulate_tile(kb, acc, (r0, c0), step.kblk, step.cbuf)
            return
        acc = _micro_kernel(kb, bl.mr, nr, dt, step.kcur, av, bv)
        _accumulate_tile(kb, bl.mr, nr, acc, (r0, c0), step.kblk, step.cbuf)

    def packed(k: Expr, j: Expr) -> Expr:
        if step.prepacked is not None:
            return step.prepacked(step.k0 + k, jp, j)
        return step.bpack[k, c0 + j]

    def from_pack() -> None:
        if not may_have_narrow_tail(step.cols, bl.nr, bl.lanes):
            run(packed, bl.nr)
            return
        with kb.if_then(step.cols - c0 <= bl.lanes):
            run(packed, bl.lanes)
        with kb.otherwise():
            run(packed, bl.nr)
    if step.direct is None:
        from_pack()
        return
    with kb.if_then(jp < step.full):
        run(lambda k, j: step.direct(step.k0 + k, c0 + j), bl.nr)
    with kb.otherwise():
        from_pack()


def may_have_narrow_tail(cols: ExprLike, nr: int, lanes: int) -> bool:
    """Whether the last column panel may have 1 to `lanes` columns (with NR > lanes)."""
    if nr <= lanes:
        return False
    return not isinstance(cols, int) or 0 < cols % nr <= lanes


def _zero_tail(kb: KernelBuilder, bl: Blocking, bpack: Buffer, cols: ExprLike) -> None:
    """bpack[:, cols : round_up(cols, NR)] = 0 once per task (packing never writes
    there; the micro-kernel reads it, and stale floats could be denormals)."""
    if isinstance(cols, int) and cols % bl.nr == 0:
        return
    padded = ceil_div(cols, bl.nr) * bl.nr
    with kb.for_range(bl.kc, name="k") as k, kb.for_range(padded - cols, name="j") as j:
        kb.store(bpack, (k, cols + j), Const(0.0, bpack.dtype))


def register_tile(kb: KernelBuilder, mr: int, nr: int,
                  body: Callable[[Expr, Expr], None]) -> None:
    """`body(r, j)` over an MR x NR register tile: r and the NR/PLAIN_LANES vectors unrolled
    around a plain PLAIN_LANES-lane loop (the loop shape gcc vectorizes into registers)."""
    with kb.for_range(mr, kind="unroll", name="r") as r, \
            kb.for_range(nr // PLAIN_LANES, kind="unroll", name="v") as v, \
            kb.for_range(PLAIN_LANES, name="l") as lane:
        body(r, v * PLAIN_LANES + lane)


def _micro_kernel(kb: KernelBuilder, mr: int, nr: int, dt: str, kcur: ExprLike,
                  av: Callable[[Expr, Expr], Expr],
                  bv: Callable[[Expr, Expr], Expr]) -> Buffer:
    """acc[MR][NR] = A panel x B panel over kcur (`bv(k, j)`: the panel's B values);
    returns acc. acc starts at zero and is consumed after the loop: merging a loaded
    start value into the loop made gcc spill one of the 12 accumulators of 6 x 16."""
    acc = kb.alloc("acc", dt, (mr, nr))
    register_tile(kb, mr, nr, lambda r, j: kb.store(acc, (r, j), Const(0.0, dt)))
    with kb.for_range(kcur, name="k") as k:
        with kb.for_range(mr, kind="unroll", name="r") as r:
            a = kb.declare("av", dt, av(r, k))
            with kb.for_range(nr // PLAIN_LANES, kind="unroll", name="v") as v, \
                    kb.for_range(PLAIN_LANES, name="l") as lane:
                j = v * PLAIN_LANES + lane
                kb.store(acc, (r, j), call("fma", a, bv(k, j), acc[r, j]))
    return acc


def _accumulate_tile(kb: KernelBuilder, mr: int, nr: int, acc: Buffer, tile: tuple,
                     kblk: Expr, cbuf: Buffer) -> None:
    """cbuf[r0:, c0:] = acc on the first K block, += acc on the others."""
    r0, c0 = tile
    with kb.if_then(eq(kblk, 0)):
        register_tile(kb, mr, nr,
                      lambda r, j: kb.store(cbuf, (r0 + r, c0 + j), acc[r, j]))
    with kb.otherwise():
        register_tile(kb, mr, nr, lambda r, j: kb.store(
            cbuf, (r0 + r, c0 + j), cbuf[r0 + r, c0 + j] + acc[r, j]))


def pack_b_rows(b_value: Callable[[Expr, Expr], Expr], j0: Expr, cols: ExprLike) -> PackB:
    """A `pack_b` for a B whose rows are contiguous: `b_value(k, col)` = B[k][col]."""
    def pack(kb: KernelBuilder, bpack: Buffer, k0: Expr, kcur: ExprLike,
             c_from: ExprLike) -> None:
        with kb.for_range(kcur, name="k") as k, kb.for_range(cols - c_from, name="j") as j:
            kb.store(bpack, (k, c_from + j), b_value(k0 + k, j0 + c_from + j))
    return pack
