"""Shared pieces of the CUDA rule kernels: launch shapes and a block-wide reduction.

`block_reduce` combines one value per thread of a 1-D block: a warp-level tree with
`__shfl_down_sync`, then one partial per warp through shared memory, then the first
warp combines those; the result is broadcast to every thread through shared memory.
It calls `__syncthreads`, so every thread of the block must reach it.

`warp_allreduce` and `group_allreduce` (the reduction template's) leave the result in
EVERY lane without a broadcast: an xor butterfly (`__shfl_xor_sync`) combines lanes l
and l ^ d at each step, and since both partners combine the same two values (IEEE +, *,
min and max are commutative) every lane of a group ends with bit-identical results.
`group_allreduce` combines aligned groups of `group` consecutive threads (a power of two
>= 32, several groups per block): a butterfly per warp, one partial per warp through a
shared buffer of its own (so no trailing barrier is needed when every call site runs
once per kernel), one `__syncthreads`, then a butterfly over the group's partials.
"""
from __future__ import annotations

from typing import Callable

from hidetc.graph.symbolic import Dim, SymDim
from hidetc.target import CudaTarget
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.cuda import shfl_xor
from hidetc.tir.ir import Const, Expr, Var, call, syncthreads, thread_idx

WARP = 32
# static __shared__ bytes a block may hold: the CUDA limit on every GPU, the target
# model's `CudaTarget.shared_bytes` (past it, the per-GPU dynamic opt-in,
# `CudaTarget.shared_optin_bytes`), for the kernels built without a target
SHARED_LIMIT = CudaTarget.shared_bytes
FULL_MASK = Const(0xFFFFFFFF, "uint32")
Combine = Callable[[Expr, Expr], Expr]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def at_least_one(x: Dim) -> Dim:
    """`max(1, x)` for a count (blocks, tiles, a batch): a symbolic `x` whose least value
    over the ranges is at least 1 is `x` itself -- `max` would compare it with 1, which a
    range like 1..64 leaves open, and record a needless guard."""
    if isinstance(x, SymDim) and x.bounds()[0] >= 1:
        return x
    return max(1, x)


def may_exceed_one(x: Dim) -> bool:
    """Whether a count may be over 1 at some size (a symbolic count: unless its greatest
    value is 1): what a kernel's general path must then handle, without a guard."""
    return x.bounds()[1] > 1 if isinstance(x, SymDim) else x > 1


def shfl_down(value: Expr, delta: int) -> Expr:
    return call("__shfl_down_sync", FULL_MASK, value, Const(delta, "int32"), dtype=value.dtype)


def warp_reduce(kb: KernelBuilder, acc: Var, combine: Combine) -> None:
    """After this, lane 0 of each warp holds the warp's combination of `acc`."""
    delta = WARP // 2
    while delta >= 1:
        kb.assign(acc, combine(acc, shfl_down(acc, delta)))
        delta //= 2


def block_reduce(kb: KernelBuilder, value: Var, combine: Combine, identity: float | Expr,
                 threads: int, name: str = "red") -> Var:
    """Combine `value` over the block's `threads` threads; returns a Var holding the
    total in every thread. `threads` is a multiple of 32."""
    warps = threads // WARP
    lane, warp = thread_idx() % WARP, thread_idx() // WARP
    partial = kb.alloc(f"{name}_partial", value.dtype, (warps,), scope="shared")
    total = kb.alloc(f"{name}_total", value.dtype, (1,), scope="shared")
    warp_reduce(kb, value, combine)
    with kb.if_then(lane < 1):
        kb.store(partial, (warp,), value)
    kb.emit(syncthreads())
    with kb.if_then(warp < 1):
        acc = kb.declare(f"{name}_acc", value.dtype, identity)
        with kb.if_then(lane < warps):
            kb.assign(acc, partial[lane])
        warp_reduce(kb, acc, combine)
        with kb.if_then(lane < 1):
            kb.store(total, (0,), acc)
    kb.emit(syncthreads())
    result = kb.declare(f"{name}_result", value.dtype, total[0])
    kb.emit(syncthreads())  # `total` may be reused by the next reduction
    return result


def warp_allreduce(kb: KernelBuilder, acc: Var, combine: Combine, width: int = WARP) -> None:
    """After this, every lane holds the combination of `acc` over its aligned group of
    `width` lanes (a power of two <= 32; every lane of the warp must execute it)."""
    delta = width // 2
    while delta >= 1:
        kb.assign(acc, combine(acc, shfl_xor(acc, delta)))
        delta //= 2


def group_allreduce(kb: KernelBuilder, acc: Var, combine: Combine, group: int, threads: int,
                    name: str = "red") -> None:
    """Combine `acc` over each aligned group of `group` consecutive threads of a 1-D block
    of `threads` threads (both powers of two, 32 <= group <= threads); afterwards every
    thread holds its group's total in `acc`. With group > 32 it allocates a shared
    buffer of threads / 32 values and calls `__syncthreads` once: every thread of the
    block must reach it, and a call site must not run twice (no trailing barrier)."""
    warp_allreduce(kb, acc, combine)
    if group <= WARP:
        return
    per_group = group // WARP
    lane, warp = thread_idx() % WARP, thread_idx() // WARP
    partial = kb.alloc(f"{name}_partial", acc.dtype, (threads // WARP,), scope="shared")
    with kb.if_then(lane < 1):
        kb.store(partial, (warp,), acc)
    kb.emit(syncthreads())
    first = thread_idx() // group * per_group
    kb.assign(acc, partial[first + lane % per_group])
    warp_allreduce(kb, acc, combine, per_group)
