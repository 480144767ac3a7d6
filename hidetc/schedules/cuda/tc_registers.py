"""Registers per thread of the tensor-core GEMM kernels (`tc_common.TcKernel`), as
ptxas counts them.

No formula over a config predicts ptxas within a few registers: its counts step (many
configs sit at exactly 64, 96 or 128) and move with the copy addresses, the k steps in
flight and the pipeline's bookkeeping as much as with the accumulators (the
accumulator-and-fragment estimate, `estimate`, misses by -42..+44; a least-squares fit
on those features still by up to 26: bench/results/2026-12-07-tc-registers.md). So the
count comes from ptxas: `tc_registers.json`, written by
`python bench/tc_registers.py --write-table`, holds per arch and per config of the
register-free space (`tc_common.tc_candidates` over every known GPU) ptxas's count for
the MatMul kernel of the reference task (REFERENCE: M = N = K = 1024, float16, no
fused epilogue), unsplit and split-K (REFERENCE_SPLITS), and the bytes it spills where
it does (a block of 512 threads is held to 128 registers: ptxas spills rather than
exceed the block's 64K).

Assumes: the table was written from the kernels the templates print now (and an nvcc
of the major named in the table). tests/schedules/test_cuda_tc_registers.py compiles
a sample of the space with nvcc on every `make test`, and the whole table in `make
test-slow`, and fails past TOLERANCE registers: a kernel change that moves the counts
asks for the table to be written again.

Guarantees: `registers(key, split, arch)` is the table's count for that kernel on the
nearest arch of the table not newer than `arch` (same major first: sm_87 -> sm_86,
sm_90a -> sm_90; else the newest older one: sm_100 -> sm_90); for a config or an arch
outside the table, `estimate`; `spills(...)` likewise (0 outside the table).

Decides nothing about other shapes: for the same config the count moves by up to ~50
either way with the task (predicated copies where tiles overhang M, N or K; batch
indexing; a fused epilogue), so this is what the space is pruned and the cost model
ranks by before anything is built, and a built kernel's own ptxas count replaces it
(`cost.kernel_estimate`).
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Optional

TABLE = Path(__file__).with_name("tc_registers.json")
REFERENCE = (1024, 1024, 1024, "float16")    # M, N, K, operand type
REFERENCE_SPLITS = 2                         # the split-K kernel of the table
TOLERANCE = 8                                # registers: the table vs nvcc today

Key = tuple[int, int, int, int, int, int]    # bm, bn, bk, wm, wn, stages


def key_text(key: Key) -> str:
    """The table's name for a config: BMxBNxBK/WMxWN/STAGES."""
    bm, bn, bk, wm, wn, stages = key
    return f"{bm}x{bn}x{bk}/{wm}x{wn}/{stages}"


def estimate(key: Key) -> int:
    """Accumulators (4 floats per m16n8 tile), A and B fragments of one k step, and 48
    for addresses and loop state: the estimate used where the table has no count."""
    bm, bn, _bk, wm, wn, _stages = key
    mt, nt = bm // wm // 16, bn // wn // 8
    return mt * nt * 4 + mt * 4 + nt * 2 + 48


@functools.lru_cache(maxsize=None)
def _table() -> dict:
    """The table file as read (empty when missing: every count is then `estimate`)."""
    if not TABLE.exists():
        return {"archs": {}}
    return json.loads(TABLE.read_text())


def _arch_number(arch: str) -> Optional[int]:
    m = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
    return int(m.group(1)) if m else None


@functools.lru_cache(maxsize=None)
def table_arch(arch: str) -> Optional[str]:
    """The arch of the table whose counts stand for `arch` (see the module docstring);
    None when the table has none at or below it."""
    number = _arch_number(arch)
    if number is None:
        return None
    known = {_arch_number(a): a for a in _table()["archs"]}
    older = [n for n in known if n is not None and n <= number]
    if not older:
        return None
    same_major = [n for n in older if n // 10 == number // 10]
    return known[max(same_major or older)]


def spills(key: Key, split: bool, arch: str) -> int:
    """The bytes of spill stores per thread ptxas reported for that kernel (0 where the
    table has no count: the estimate never predicts a spill)."""
    source = table_arch(arch)
    if source is None:
        return 0
    counts = _table().get("spills", {}).get(source, {}).get(key_text(key))
    return int(counts[1 if split else 0]) if counts else 0


def registers(key: Key, split: bool, arch: str) -> int:
    """ptxas's count for the reference kernel of config `key` (split-K when `split`)
    on `arch`, from the table; `estimate(key)` where the table has none."""
    source = table_arch(arch)
    if source is not None:
        counts = _table()["archs"][source].get(key_text(key))
        if counts is not None:
            return int(counts[1 if split else 0])
    return estimate(key)
