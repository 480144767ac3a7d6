"""Shared pieces of the CUDA rule kernels: launch shapes and a block-wide reduction.

`block_reduce` combines one value per thread of a 1-D block: a warp-level tree with
`__shfl_down_sync`, then one partial per warp through shared memory, then the first
warp combines those; the result is broadcast to every thread through shared memory.
It calls `__syncthreads`, so every thread of the block must reach it.
"""
from __future__ import annotations

from typing import Callable

from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Const, Expr, Var, call, syncthreads, thread_idx

WARP = 32
FULL_MASK = Const(0xFFFFFFFF, "uint32")
Combine = Callable[[Expr, Expr], Expr]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


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
