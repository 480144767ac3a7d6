"""The f32 GEMM micro-kernel in AVX2/FMA intrinsics (see `microkernel.py` for the
blocked GEMM around it).

    acc[r][v] = 0                        (MR x NR/8 `float32x8` variables: ymm registers)
    for k < kcur:
        b[v] = loadu(&B(k, v*8))          (NR/8 vector loads of the B panel row)
        for r < MR: a = broadcast(&A(r, k)); acc[r][v] = fmadd(a, b[v], acc[r][v])
    tile: cbuf[r0 + r][c0 + 8v : +8] = acc[r][v] on the first K block, else
          cbuf[...] = cbuf[...] + acc[r][v]   (a rounded add, as the scalar form)

Every accumulator is its own IR variable (the loops over r and v are unrolled here, in
Python), so gcc allocates registers exactly: MR * NR/8 accumulators + NR/8 B vectors + 1
broadcast (6 x 16: 15 of the 16 ymm registers) and never spills or scalarizes them --
which its auto-vectorizer did for some shapes of the plain C form. The arithmetic is
the scalar form's (fma from zero over the K block, then one add into cbuf), so results
match it bit for bit and `-ffp-contract=off` semantics hold (fma only where written).

Assumes: `bv(k, j)` is a Load whose 8 elements j .. j+7 are contiguous (a packed row or
a row-major B row); `av(r, k)` a Load (broadcast from memory) or any f32 expression
(set1). The callers guarantee both in bounds for every r < MR, j < NR.
"""
from __future__ import annotations

from typing import Callable

from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Buffer, Call, Expr, ExprLike, Load, Var, eq

VEC = "float32x8"
LANES = 8


def vcall(func: str, *args: Expr, dtype: str = VEC) -> Call:
    return Call(func, tuple(args), dtype)


def _broadcast(x: Expr) -> Call:
    if isinstance(x, Load):
        return vcall("_mm256_broadcast_ss", x)
    return vcall("_mm256_set1_ps", x)


def _vector_load(x: Expr) -> Call:
    if not isinstance(x, Load):
        raise TypeError(f"the AVX2 micro-kernel loads B rows from memory, got {x}")
    return vcall("_mm256_loadu_ps", x)


def micro_kernel(kb: KernelBuilder, mr: int, nr: int, kcur: ExprLike,
                 av: Callable[[Expr, Expr], Expr],
                 bv: Callable[[Expr, Expr], Expr]) -> list[list[Var]]:
    """The MR x NR accumulators after the K loop (see the module docstring). A tile of
    fewer than MIN_CHAINS accumulators (the MR x 8 kernel of a ragged last panel) keeps
    two sets, for even and odd k, added at the end: one set would leave the FMA units
    waiting on its own latency (4 cycles, 2 units: 8 chains in flight)."""
    sets = accumulator_sets(kb, mr, nr)
    k_loop(kb, sets, kcur, av, bv)
    return merged(kb, sets)


MIN_CHAINS = 8   # independent FMA chains that keep both units of Zen 3 / Skylake busy


def accumulator_sets(kb: KernelBuilder, mr: int, nr: int) -> list[list[list[Var]]]:
    """One set of MR x NR/8 accumulators, or two (even and odd k) when one set has
    fewer than MIN_CHAINS independent chains."""
    nv = nr // LANES
    return [_zeros(kb, mr, nv) for _ in range(1 if mr * nv >= MIN_CHAINS else 2)]


def k_loop(kb: KernelBuilder, sets: list, kcur: ExprLike, av: Callable, bv: Callable) -> None:
    """k_steps for k < kcur, alternating between the accumulator sets."""
    if len(sets) == 1:
        with kb.for_range(kcur, name="k") as k:
            _k_step(kb, sets[0], k, av, bv)
        return
    with kb.for_range(kcur // 2, name="k") as k2:
        _k_step(kb, sets[0], k2 * 2, av, bv)
        _k_step(kb, sets[1], k2 * 2 + 1, av, bv)
    with kb.for_range(kcur % 2, name="k") as k1:    # the last k of an odd depth
        _k_step(kb, sets[0], kcur - 1 + k1, av, bv)


def merged(kb: KernelBuilder, sets: list) -> list[list[Var]]:
    acc = sets[0]
    for other in sets[1:]:
        for r, row in enumerate(acc):
            for v in range(len(row)):
                kb.assign(row[v], vcall("_mm256_add_ps", row[v], other[r][v]))
    return acc


def micro_kernel_taps(kb: KernelBuilder, mr: int, nr: int, channels: ExprLike, taps: int,
                      av: Callable[[int, Expr, int], Expr],
                      bv: Callable[[Expr, int, int], Expr]) -> list[list[Var]]:
    """`micro_kernel` over a K block of `channels` x `taps` with the taps unrolled:
    acc[r][v] += av(r, ci, t) * bv(ci, t, 8v : 8v + 8) for ci < channels, t < taps
    (the direct convolution's loop: per channel, one statically known input offset per
    tap, so no index division in the loop). Under MIN_CHAINS accumulators the even and
    odd taps go to two sets, added at the end."""
    if taps == 1:
        return micro_kernel(kb, mr, nr, channels, lambda r, c: av(r, c, 0),
                            lambda c, j: bv(c, 0, j))
    sets = accumulator_sets(kb, mr, nr)
    with kb.for_range(channels, name="ci") as ci:
        for t in range(taps):
            _k_step(kb, sets[t % len(sets)], ci,
                    lambda r, c, t=t: av(r, c, t), lambda c, j, t=t: bv(c, t, j))
    return merged(kb, sets)


def _zeros(kb: KernelBuilder, mr: int, nv: int) -> list[list[Var]]:
    zero = vcall("_mm256_setzero_ps")
    return [[kb.declare("acc", VEC, zero) for _ in range(nv)] for _ in range(mr)]


def _k_step(kb: KernelBuilder, acc: list[list[Var]], k: Expr,
            av: Callable[[Expr, Expr], Expr], bv: Callable[[Expr, Expr], Expr]) -> None:
    """acc[r][v] += A(r, k) * B(k, 8v : 8v + 8) for the whole tile."""
    b = [kb.declare("b", VEC, _vector_load(bv(k, v * LANES))) for v in range(len(acc[0]))]
    for r, row in enumerate(acc):
        a = kb.declare("a", VEC, _broadcast(av(r, k)))
        for v in range(len(row)):
            kb.assign(row[v], vcall("_mm256_fmadd_ps", a, b[v], row[v]))


def accumulate_tile(kb: KernelBuilder, acc: list[list[Var]], tile: tuple, kblk: Expr,
                    cbuf: Buffer) -> None:
    """cbuf[r0 + r][c0 + 8v : +8] = acc[r][v] on the first K block, += on the others."""
    r0, c0 = tile
    with kb.if_then(eq(kblk, 0)):
        for r, row in enumerate(acc):
            for v, x in enumerate(row):
                kb.evaluate(vcall("_mm256_storeu_ps", cbuf[r0 + r, c0 + v * LANES], x,
                                  dtype="void"))
    with kb.otherwise():
        for r, row in enumerate(acc):
            for v, x in enumerate(row):
                at = cbuf[r0 + r, c0 + v * LANES]
                total = vcall("_mm256_add_ps", vcall("_mm256_loadu_ps", at), x)
                kb.evaluate(vcall("_mm256_storeu_ps", at, total, dtype="void"))
