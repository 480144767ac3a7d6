"""Registers per thread of the tensor-core GEMM kernels (`tc_common.TcKernel`), as
ptxas counts them.

No formula over a config predicts ptxas within a few registers: its counts step (many
configs sit at exactly 64, 96 or 128) and move with the copy addresses, the k steps in
flight and the pipeline's bookkeeping as much as with the accumulators (the
accumulator-and-fragment estimate, `estimate`, misses by -42..+44; a least-squares fit
on those features still by up to 26: bench/results/2026-12-07-tc-registers.md). So the
count comes from ptxas: `tc_registers.json`, written by
`python bench/tc_registers.py --write-table`, holds per arch and per config of the
register-free candidates of every known GPU (`tc_common.tc_candidates`,
`matmul_int8_tc.int8_candidates`) ptxas's count for
the MatMul kernel of the reference task, and the bytes it spills where it does (a block
of 512 threads is held to 128 registers: ptxas spills rather than exceed the block's
64K). Two families (FAMILIES): "half" (`tc_common.TcKernel` through `matmul_tc`, M = N =
K = 1024 float16, no fused epilogue; unsplit and split-K, REFERENCE_SPLITS) and "int8"
(`matmul_int8_tc`, MatMulInteger 1024^3 uint8 x int8 with per-tensor zero points; no
split-K).

Assumes: the table was written from the kernels the templates print now (and an nvcc
of the major named in the table). tests/schedules/test_cuda_tc_registers.py compiles
a sample of the space with nvcc on every `make test`, and the whole table in `make
test-slow`, and fails past TOLERANCE registers: a kernel change that moves the counts
asks for the table to be written again.

Guarantees: `count(family, key, split, arch)` is the table's count for that kernel on
the nearest arch of the table not newer than `arch` (same major first: sm_87 -> sm_86,
sm_90a -> sm_90; else the newest older one: sm_100 -> sm_90); None for a config or an
arch outside the table, where the config classes fall back to their formula
(`estimate` for the half family); `spills(...)` likewise (0 outside the table).

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
# per family: its template's reference task (M, N, K, operand types) and whether the
# table holds a split-K column
FAMILIES = {"half": {"m_n_k": (1024, 1024, 1024), "types": ("float16",), "split": True},
            "int8": {"m_n_k": (1024, 1024, 1024), "types": ("uint8", "int8"),
                     "zero_points": "per tensor", "split": False}}
REFERENCE_SPLITS = 2                         # the split-K kernel of the table
TOLERANCE = 8                                # registers: the table vs nvcc today

Key = tuple[int, int, int, int, int, int]    # bm, bn, bk, wm, wn, stages


def key_text(key: Key) -> str:
    """The table's name for a config: BMxBNxBK/WMxWN/STAGES."""
    bm, bn, bk, wm, wn, stages = key
    return f"{bm}x{bn}x{bk}/{wm}x{wn}/{stages}"


def estimate(key: Key) -> int:
    """Accumulators (4 floats per m16n8 tile), A and B fragments of one k step, and 48
    for addresses and loop state: the half family's estimate where the table has no
    count."""
    bm, bn, _bk, wm, wn, _stages = key
    mt, nt = bm // wm // 16, bn // wn // 8
    return mt * nt * 4 + mt * 4 + nt * 2 + 48


@functools.lru_cache(maxsize=None)
def _table() -> dict:
    """The table file as read (no families when missing: every count is then the
    template's estimate)."""
    if not TABLE.exists():
        return {"families": {}}
    return json.loads(TABLE.read_text())


def _family(family: str) -> dict:
    return _table()["families"].get(family) or {"archs": {}, "spills": {}}


def _arch_number(arch: str) -> Optional[int]:
    m = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
    return int(m.group(1)) if m else None


@functools.lru_cache(maxsize=None)
def table_arch(arch: str, family: str = "half") -> Optional[str]:
    """The arch of the family's table whose counts stand for `arch` (see the module
    docstring); None when the table has none at or below it."""
    number = _arch_number(arch)
    if number is None:
        return None
    known = {_arch_number(a): a for a in _family(family)["archs"]}
    older = [n for n in known if n is not None and n <= number]
    if not older:
        return None
    same_major = [n for n in older if n // 10 == number // 10]
    return known[max(same_major or older)]


def _entry(block: str, family: str, key: Key, split: bool, arch: str) -> Optional[int]:
    source = table_arch(arch, family)
    if source is None:
        return None
    counts = _family(family).get(block, {}).get(source, {}).get(key_text(key))
    column = 1 if split else 0
    return int(counts[column]) if counts is not None and column < len(counts) else None


def count(family: str, key: Key, split: bool, arch: str) -> Optional[int]:
    """ptxas's registers for the family's reference kernel of config `key` (split-K
    when `split`) on `arch`; None where the table has none."""
    return _entry("archs", family, key, split, arch)


def spills(family: str, key: Key, split: bool, arch: str) -> int:
    """The bytes of spill stores per thread ptxas reported for that kernel (0 where the
    table has none: an estimate never predicts a spill)."""
    return _entry("spills", family, key, split, arch) or 0
