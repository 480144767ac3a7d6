"""The f32 GEMM micro-kernel in vector intrinsics, AVX2/FMA or AVX-512F (`cpu_isa.current()`:
8 or 16 f32 lanes, L below; see `microkernel.py` for the blocked GEMM around it).

    acc[r][v] = 0                        (MR x NR/L vector variables: ymm/zmm registers)
    for k < kcur:
        b[v] = loadu(&B(k, v*L))          (NR/L vector loads of the B panel row)
        for r < MR: a = broadcast(A(r, k)); acc[r][v] = fmadd(a, b[v], acc[r][v])
    tile: cbuf[r0 + r][c0 + Lv : +L] = acc[r][v] on the first K block, else
          cbuf[...] = cbuf[...] + acc[r][v]   (a rounded add, as the scalar form)

Every accumulator is its own IR variable (the loops over r and v are unrolled here, in
Python), so gcc allocates registers exactly: MR * NR/L accumulators + NR/L B vectors + 1
broadcast (AVX2 6 x 16: 15 of the 16 ymm registers; AVX-512 14 x 32: 31 of 32 zmm) and
never spills or scalarizes them -- which its auto-vectorizer did for some shapes of the
plain C form. The arithmetic is the scalar form's (fma from zero over the K block, then
one add into cbuf), so results match it bit for bit and `-ffp-contract=off` semantics
hold (fma only where written). The module keeps its name; `widths` says which vectors
(16-wide on AVX-512, 8-wide otherwise and for an 8-column rest) cover a panel.

Assumes: `bv(k, j)` is a Load whose L elements j .. j+L-1 are contiguous (a packed row or
a row-major B row); `av(r, k)` a Load (broadcast from memory) or any f32 expression
(set1). The callers guarantee both in bounds for every r < MR, j < NR.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Call, Const, Expr, ExprLike, Load, Var, eq, select

_VECS = {8: "float32x8", 16: "float32x16"}   # the IR vector dtypes (codegen.c prints them)
NARROW = 8          # a panel's last 8 columns when NR is not a multiple of LANES


def vector_dtype(lanes: int) -> str:
    """The IR dtype of a vector of `lanes` f32 (printed `__m256` / `__m512`)."""
    return _VECS[lanes]


def op(name: str, lanes: int) -> str:
    """The intrinsic `name` for a vector of `lanes` floats: `_mm256_fmadd_ps`, ..."""
    return f"_mm{32 * lanes}_{name}_ps"


def widths(nr: int, lanes: int) -> list[int]:
    """The vector widths covering an NR-column panel: `lanes`-wide vectors (the target
    ISA's: 8 AVX2, 16 AVX-512), and an 8-wide one for the rest (AVX-512 with NR % 16 ==
    8: every config is a multiple of 8, so AVX2's tiles build on AVX-512 too)."""
    return [lanes] * (nr // lanes) + [NARROW] * (nr % lanes // NARROW)


def offsets(nr: int, lanes: int) -> list[int]:
    """Column offset of each of `widths(nr, lanes)`'s vectors."""
    out, at = [], 0
    for w in widths(nr, lanes):
        out.append(at)
        at += w
    return out


def vcall(func: str, *args: Expr, dtype: str) -> Call:
    return Call(func, tuple(args), dtype)


def _broadcast(x: Expr, lanes: int) -> Call:
    if isinstance(x, Load) and lanes == 8:
        return vcall("_mm256_broadcast_ss", x, dtype=_VECS[8])   # from memory (address)
    return vcall(op("set1", lanes), x, dtype=_VECS[lanes])       # vbroadcastss the value


def load(x: Expr, lanes: int) -> Call:
    """loadu(&x): `lanes` contiguous floats from memory."""
    if not isinstance(x, Load):
        raise TypeError(f"the vector micro-kernel loads B rows from memory, got {x}")
    return vcall(op("loadu", lanes), x, dtype=_VECS[lanes])


def lanes_of(x: Var) -> int:
    return 16 if x.dtype == _VECS[16] else 8


def store(kb: KernelBuilder, at: Load, value: Var) -> None:
    """storeu(&at, value): one vector (of value's width)."""
    kb.evaluate(vcall(op("storeu", lanes_of(value)), at, value, dtype="void"))


def add(a: Expr, b: Var) -> Call:
    lanes = lanes_of(b)
    return vcall(op("add", lanes), a, b, dtype=_VECS[lanes])


def micro_kernel(kb: KernelBuilder, mr: int, nr: int, lanes: int, kcur: ExprLike,
                 av: Callable[[Expr, Expr], Expr],
                 bv: Callable[[Expr, Expr], Expr],
                 ahead: Ahead | None = None) -> list[list[Var]]:
    """The MR x NR accumulators after the K loop (see the module docstring). A tile of
    fewer than MIN_CHAINS accumulators (the MR x L kernel of a ragged last panel) keeps
    two sets, for even and odd k, added at the end: one set would leave the FMA units
    waiting on its own latency (4 cycles, 2 units: 8 chains in flight). `ahead`: the
    B rows to prefetch alongside (`Ahead`). `lanes`: the target ISA's vector width."""
    sets = accumulator_sets(kb, mr, nr, lanes)
    k_loop(kb, sets, kcur, av, bv, ahead)
    return merged(kb, sets)


@dataclass(frozen=True)
class Ahead:
    """Software prefetch of the B panel a later micro-tile reads: while `when` holds
    (the first micro-tile over a panel, the one whose B rows come from memory), each k
    step also prefetches row k of the next panel into L2 (`row(k, j)`: its element j,
    one prefetch per 64-byte line). The weights of a model are read once per pass and
    mostly come from DRAM; the hardware streamer restarts at every 4 KB page, so the
    first micro-tile of each panel waits on them while the others hit L1/L2."""
    when: Expr
    row: Callable[[Expr, int], Load]


def ahead_of_panels(kb: KernelBuilder, ip: Expr, jp: Expr, panels: ExprLike, rows: Expr,
                    next_rows: ExprLike, row: Callable[[Expr, Expr, int], Load]) -> Ahead:
    """The `Ahead` of a task's loop over panels jp < `panels` within a K block whose
    rows start at `rows`: the first micro-tile (ip == 0) over panel jp prefetches panel
    jp + 1 at the same rows, or after the last panel the first at `next_rows` (the next
    K block's). `row(k, panel, j)`: the B element (the caller clamps k to its K)."""
    last = eq(jp, panels - 1)
    nxt = kb.declare("nxt", "int32", select(last, 0, jp + 1))
    first = kb.declare("row0", "int32", select(last, next_rows, rows))
    return Ahead(eq(ip, 0), lambda k, j: row(first + k, nxt, j))


def prefetch(kb: KernelBuilder, ahead: Ahead, k: Expr, nr: int) -> None:
    with kb.if_then(ahead.when):
        for j in range(0, nr, 64 // 4):
            kb.evaluate(Call("__builtin_prefetch", (ahead.row(k, j), Const(0, "int32"),
                                                    Const(2, "int32")), "void"))


MIN_CHAINS = 8   # independent FMA chains that keep both units of Zen 3 / Skylake busy


def accumulator_sets(kb: KernelBuilder, mr: int, nr: int, lanes: int
                     ) -> list[list[list[Var]]]:
    """One set of MR x len(widths(NR)) accumulators, or two (even and odd k) when one
    set has fewer than MIN_CHAINS independent chains."""
    nv = len(widths(nr, lanes))
    return [_zeros(kb, mr, nr, lanes) for _ in range(1 if mr * nv >= MIN_CHAINS else 2)]


def k_loop(kb: KernelBuilder, sets: list, kcur: ExprLike, av: Callable, bv: Callable,
           ahead: Ahead | None = None) -> None:
    """k_steps for k < kcur, alternating between the accumulator sets (`ahead`: the
    rows prefetched alongside)."""
    nr = sum(lanes_of(x) for x in sets[0][0])
    if len(sets) == 1:
        with kb.for_range(kcur, name="k") as k:
            _k_step(kb, sets[0], k, av, bv)
            if ahead is not None:
                prefetch(kb, ahead, k, nr)
        return
    with kb.for_range(kcur // 2, name="k") as k2:
        _k_step(kb, sets[0], k2 * 2, av, bv)
        _k_step(kb, sets[1], k2 * 2 + 1, av, bv)
        if ahead is not None:
            prefetch(kb, ahead, k2 * 2, nr)
            prefetch(kb, ahead, k2 * 2 + 1, nr)
    with kb.for_range(kcur % 2, name="k") as k1:    # the last k of an odd depth
        _k_step(kb, sets[0], kcur - 1 + k1, av, bv)


def merged(kb: KernelBuilder, sets: list) -> list[list[Var]]:
    acc = sets[0]
    for other in sets[1:]:
        for r, row in enumerate(acc):
            for v in range(len(row)):
                kb.assign(row[v], add(row[v], other[r][v]))
    return acc


def micro_kernel_taps(kb: KernelBuilder, mr: int, nr: int, lanes: int, channels: ExprLike,
                      taps: int, av: Callable[[int, Expr, int], Expr],
                      bv: Callable[[Expr, int, int], Expr]) -> list[list[Var]]:
    """`micro_kernel` over a K block of `channels` x `taps` with the taps unrolled:
    acc[r][v] += av(r, ci, t) * bv(ci, t, Lv : Lv + L) for ci < channels, t < taps
    (the direct convolution's loop: per channel, one statically known input offset per
    tap, so no index division in the loop). Under MIN_CHAINS accumulators the even and
    odd taps go to two sets, added at the end."""
    if taps == 1:
        return micro_kernel(kb, mr, nr, lanes, channels, lambda r, c: av(r, c, 0),
                            lambda c, j: bv(c, 0, j))
    sets = accumulator_sets(kb, mr, nr, lanes)
    with kb.for_range(channels, name="ci") as ci:
        for t in range(taps):
            _k_step(kb, sets[t % len(sets)], ci,
                    lambda r, c, t=t: av(r, c, t), lambda c, j, t=t: bv(c, t, j))
    return merged(kb, sets)


def _zeros(kb: KernelBuilder, mr: int, nr: int, lanes: int) -> list[list[Var]]:
    return [[kb.declare("acc", _VECS[w], vcall(op("setzero", w), dtype=_VECS[w]))
             for w in widths(nr, lanes)] for _ in range(mr)]


def _k_step(kb: KernelBuilder, acc: list[list[Var]], k: Expr,
            av: Callable[[Expr, Expr], Expr], bv: Callable[[Expr, Expr], Expr]) -> None:
    """acc[r][v] += A(r, k) * B(k, Lv : Lv + L) for the whole tile."""
    lanes = [lanes_of(x) for x in acc[0]]
    at, b = 0, []
    for w in lanes:
        b.append(kb.declare("b", _VECS[w], load(bv(k, at), w)))
        at += w
    for r, row in enumerate(acc):
        a = {w: kb.declare("a", _VECS[w], _broadcast(av(r, k), w)) for w in sorted(set(lanes))}
        for v in range(len(row)):
            kb.assign(row[v], vcall(op("fmadd", lanes[v]), a[lanes[v]], b[v], row[v],
                                    dtype=_VECS[lanes[v]]))


def accumulate_tile(kb: KernelBuilder, acc: list[list[Var]], tile: tuple, kblk: Expr,
                    cbuf: Buffer) -> None:
    """cbuf[r0 + r][c0 + Lv : +L] = acc[r][v] on the first K block, += on the others."""
    r0, c0 = tile
    cols = [sum(lanes_of(x) for x in acc[0][:v]) for v in range(len(acc[0]))]
    with kb.if_then(eq(kblk, 0)):
        for r, row in enumerate(acc):
            for v, x in enumerate(row):
                store(kb, cbuf[r0 + r, c0 + cols[v]], x)
    with kb.otherwise():
        for r, row in enumerate(acc):
            for v, x in enumerate(row):
                at = cbuf[r0 + r, c0 + cols[v]]
                store(kb, at, add(load(at, lanes_of(x)), x))
