"""CPU rule for MatMul (numpy semantics: batched, broadcast, 1-D operands).

Schedule: output tiles of MR rows x NC columns run in parallel; a tile accumulates in a
local MR x NC buffer over k (rows unrolled, the column loop contiguous so gcc
vectorizes it), then is stored. Rows past M are clamped on load (their results are
discarded), columns past N are skipped by the loop bound, so any M, N, K works.
The CPU template issue replaces this with packed panels and a register micro-kernel.
"""
from __future__ import annotations

import math

from hidetc.compute.injective import broadcast_index
from hidetc.schedules.task import Task
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Const, Function, minimum
from hidetc.tir.mapping import spatial

NC = 256
MR = 4


def build_matmul(task: Task, name: str) -> Function:
    a_type, b_type = task.inputs[0], task.inputs[1]
    out_type = task.outputs[0]
    a_shape = a_type.shape if len(a_type.shape) > 1 else (1,) + a_type.shape
    b_shape = b_type.shape if len(b_type.shape) > 1 else b_type.shape + (1,)
    m, k_dim = a_shape[-2:]
    n = b_shape[-1]
    batch = _batch_shape(a_shape, b_shape)
    mr, nc = min(MR, m), min(NC, n)
    tiles = (math.prod(batch), -(-m // mr), -(-n // nc))
    dt = out_type.dtype
    kb = KernelBuilder(name, "cpu")
    a = kb.buffer("a", dt, a_shape)
    b = kb.buffer("b", dt, b_shape)
    out = kb.buffer("out", dt, batch + (m, n))
    with kb.for_range(math.prod(tiles), kind="parallel", name="p") as p:
        with kb.for_mapping(spatial(*tiles), p, names=["bt", "ib", "jb"]) as (bt, ib, jb):
            bidx = _unravel_batch(kb, bt, batch)
            i0, j0 = ib * mr, jb * nc
            cols = kb.declare("cols", "int32", minimum(n - j0, nc))
            acc = kb.alloc("acc", dt, (mr, nc))
            with kb.for_range(mr, kind="unroll", name="r") as r:
                with kb.for_range(cols, name="j") as j:
                    kb.store(acc, (r, j), Const(0.0, dt))
            with kb.for_range(k_dim, name="k") as k:
                for r in range(mr):
                    row = minimum(i0 + r, m - 1)
                    a_idx = tuple(broadcast_index(bidx, a_shape[:-2])) + (row, k)
                    av = kb.declare("av", dt, a[a_idx])
                    with kb.for_range(cols, name="j") as j:
                        bv = b[tuple(broadcast_index(bidx, b_shape[:-2])) + (k, j0 + j)]
                        kb.store(acc, (r, j), acc[r, j] + av * bv)
            with kb.for_range(minimum(m - i0, mr), name="r") as r:
                with kb.for_range(cols, name="j") as j:
                    kb.store(out, tuple(bidx) + (i0 + r, j0 + j), acc[r, j])
    return kb.finish()


def _batch_shape(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    a_b, b_b = a_shape[:-2], b_shape[:-2]
    rank = max(len(a_b), len(b_b))
    a_b = (1,) * (rank - len(a_b)) + a_b
    b_b = (1,) * (rank - len(b_b)) + b_b
    return tuple(max(x, y) for x, y in zip(a_b, b_b))


def _unravel_batch(kb: KernelBuilder, flat, batch: tuple[int, ...]):
    if not batch:
        return []
    idx = []
    for d in range(len(batch)):
        inner = math.prod(batch[d + 1:])
        q = flat if inner == 1 else flat // inner
        idx.append(Const(0, "int32") if batch[d] == 1 else (q if d == 0 else q % batch[d]))
    return idx
