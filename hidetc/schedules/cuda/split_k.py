"""Split-K's end, shared by the tensor-core (`tc_common.TcKernel`) and SIMT
(`gemm_simt.SimtGemm`) GEMM skeletons: one launch, deterministic, no atomics on the
data.

Each of the S blocks of an output tile has summed its split's k tiles into its
accumulators. Then (`reduce_splits`):
- every thread writes its accumulators to a TRANSIENT workspace (`declare`: per tile
  and split, thread-major, so the writes are coalesced: slot ((tile * S + s) * ACC +
  a) * threads + tid) and waits at a barrier (no fence of its own: the barrier orders
  its stores before thread 0's release fence, which is cumulative);
- one thread, between the protocol's one fence pair (release: the block's partials,
  seen through the barrier, before the count; acquire: the other blocks' after it --
  CUTLASS's semaphore pattern), bumps the tile's arrival counter (a ZEROED scratch buffer,
  `hidetc.tir.scratch`) with atomicAdd and tells the block through `flag` (a shared
  element the block no longer needs) whether it arrived last;
- the block that arrived last reads the S partial sums back through L2 (`load_cg`)
  and adds them in split order 0..S-1, whatever order the blocks ran in (the same
  bits on every run), READ_CHUNK accumulators at a time (all of them at once put a
  load per accumulator in flight: a 64x64 warp tile's 128 accumulators took ptxas to
  255 registers, `tc_registers`), runs the caller's epilogue (so grafted epilogues ride on it),
  and resets the counter for the next launch.

The workspace and the counters are sized by the tile count, so a kernel over a range of
sizes that leaves it open runs unsplit (`unsplit`, the templates' `over_range`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, TypeVar

from hidetc.tir import scratch
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.cuda import atomic_add, load_cg, threadfence
from hidetc.tir.ir import Buffer, Const, Expr, Load, eq, ne, select, syncthreads, thread_idx

C = TypeVar("C")
READ_CHUNK = 16      # accumulators whose partial sums the last block reads at a time


def unsplit(task, config: C) -> C:
    """`config` without split-K: what a split-K template's `over_range` gives where the
    range leaves the tile count open."""
    return replace(config, splits=1) if getattr(config, "splits", 1) > 1 else config


def declare(kb: KernelBuilder, tiles: int, splits: int, per_tile: int, dtype: str
            ) -> tuple[Buffer, Buffer]:
    """(workspace, counters): the scratch buffers of `tiles` output tiles of `per_tile`
    accumulators each, declared after the kernel's own buffers."""
    ws = kb.buffer("ws", dtype, (tiles * splits * per_tile,))
    return ws, kb.buffer("counters", "int32", (tiles,))


def scratch_attr(ws: Buffer, counters: Buffer) -> tuple:
    """The Function's `scratch` attr for these buffers."""
    return ((ws.name, scratch.TRANSIENT), (counters.name, scratch.ZEROED))


def reduce_splits(kb: KernelBuilder, acc: Buffer, count: int,
                  element: Callable[[Expr], tuple], ws: Buffer, counters: Buffer,
                  tile: Expr, split: Expr, splits: int, threads: int, flag: Load,
                  epilogue: Callable[[], None]) -> None:
    """See the module docstring. `acc` holds `count` accumulators per thread,
    `element(a)` the index of the a-th; `flag` a shared element free after the main
    loop's last barrier (the block's tiles are consumed)."""
    tid = thread_idx()

    def slot(s: Expr, a: Expr) -> Expr:
        return ((tile * splits + s) * count + a) * threads + tid

    with kb.for_range(count, kind="unroll", name="a") as a:
        kb.store(ws, (slot(split, a),), acc[element(a)])
    kb.emit(syncthreads())
    one, zero = Const(1.0, flag.dtype), Const(0.0, flag.dtype)
    with kb.if_then(eq(tid, 0)):
        kb.emit(threadfence())
        arrived = kb.declare("arrived", "int32", atomic_add(counters[tile], 1))
        kb.emit(threadfence())
        kb.store(flag.buffer, flag.indices, select(eq(arrived, splits - 1), one, zero))
    kb.emit(syncthreads())
    with kb.if_then(ne(flag, zero)):
        with kb.for_range(count, kind="unroll", name="z") as a:
            kb.store(acc, element(a), Const(0.0, acc.dtype))
        for start in range(0, count, READ_CHUNK):     # a chunk's reads in flight
            size = min(READ_CHUNK, count - start)
            with kb.for_range(splits, kind="rolled", name="sp") as sp:
                with kb.for_range(size, kind="unroll", name="a") as a:
                    i = a + start
                    kb.store(acc, element(i), acc[element(i)] + load_cg(ws[slot(sp, i)]))
        epilogue()
        with kb.if_then(eq(tid, 0)):
            kb.store(counters, (tile,), Const(0, "int32"))
