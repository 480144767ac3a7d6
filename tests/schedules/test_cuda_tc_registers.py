"""The tensor-core spaces' registers per thread follow ptxas (issue 41.2).

`TcConfig.registers_on(arch)` and `Int8TcConfig.registers_on(arch)` read
`schedules/cuda/tc_registers.json` (ptxas's counts at each family's reference task,
written by bench/tc_registers.py --write-table). Checked here, for the half (`matmul_tc`)
and int8 (`matmul_int8_tc`) families: the table covers every candidate of every known
GPU; a sample of each space (and every default) compiled by nvcc today is within
TOLERANCE of the table, unsplit and (half) split-K, on an Ampere and a Hopper arch, and
does not spill (the whole table, every arch: `make test-slow`); no default reaches 255
registers; no config of a space spills; the space is pruned by those counts at other
limits.
"""
from __future__ import annotations

import random
import shutil
from dataclasses import replace

import pytest
from helpers.tc_ptxas import reference_counts

from hidetc.schedules.cuda import matmul_int8_tc, matmul_tc, tc_registers
from hidetc.schedules.cuda.tc_common import tc_candidates, tc_space
from hidetc.target import KNOWN_GPUS

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
TOLERANCE = tc_registers.TOLERANCE
STALE = "the table is stale: run python bench/tc_registers.py --write-table"
# family -> (candidates of a GPU, space of a GPU, defaults, split-K column)
FAMILIES = {"half": (tc_candidates, tc_space, matmul_tc.DEFAULTS, True),
            "int8": (matmul_int8_tc.int8_candidates, matmul_int8_tc.int8_space,
                     matmul_int8_tc.DEFAULTS, False)}


def misses(family: str, configs: list, arch: str, split: bool) -> list[str]:
    """The configs whose table count is more than TOLERANCE from ptxas's today."""
    counted = reference_counts(configs, arch, split=split, family=family)
    out = []
    for c, facts in zip(configs, counted):
        table = tc_registers.count(family, c.key, split, arch)
        if table is None or abs(table - facts["registers"]) > TOLERANCE:
            out.append(f"{family} {tc_registers.key_text(c.key)}{' split' if split else ''}"
                       f": table {table}, ptxas {facts['registers']}")
    return out


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_table_counts_every_candidate_of_every_known_gpu(family):
    candidates = FAMILIES[family][0]
    for gpu in KNOWN_GPUS.values():
        assert tc_registers.table_arch(gpu.arch, family) is not None, gpu.name
        missing = [c for c in candidates(gpu)
                   if tc_registers.count(family, c.key, False, gpu.arch) is None]
        assert not missing, (gpu.name, missing[:3])


def test_archs_outside_the_table_take_the_nearest_older_one():
    assert tc_registers.table_arch("sm_87") == "sm_86"
    assert tc_registers.table_arch("sm_90a") == "sm_90"
    assert tc_registers.table_arch("sm_100") == "sm_90"
    assert tc_registers.table_arch("sm_75") is None
    first = matmul_tc.DEFAULTS[0]
    assert tc_registers.count("half", first.key, False, "sm_75") is None
    assert first.registers_on("sm_75") == tc_registers.estimate(first.key)
    assert first.registers_on("sm_90a") == first.registers_on("sm_90")
    int8 = matmul_int8_tc.DEFAULTS[0]
    assert int8.registers_on("sm_75") == int8.estimated_registers


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("gpu", sorted(KNOWN_GPUS))
def test_no_default_reaches_the_register_cap(family, gpu):
    _, _, defaults, split = FAMILIES[family]
    target = KNOWN_GPUS[gpu]
    for cfg in defaults:
        for splits in (1, 2)[:1 + split]:
            assert replace(cfg, splits=splits).registers_on(target.arch) < 255, cfg


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("gpu", sorted(KNOWN_GPUS))
def test_no_config_of_the_space_spills(family, gpu):
    """Configs ptxas spilled at the reference (e.g. a 512-thread block held to 128
    registers) are out of the space, split-K variants included."""
    candidates, space, _, _ = FAMILIES[family]
    target = KNOWN_GPUS[gpu]
    kept = space(target)
    assert not [c for c in kept if c.spills_on(target.arch)]
    spilling = {c for c in candidates(target) if c.spills_on(target.arch)}
    assert not spilling & set(kept)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("max_registers", [96, 128, 168])
def test_the_space_is_pruned_by_the_counts_at_other_limits(family, max_registers):
    """A GPU with fewer registers per thread (a property over limits no GPU here has):
    every config kept is within them by the table's count, and those dropped are over
    them (or need dynamic shared memory, where the bound is 192)."""
    space = FAMILIES[family][1]
    h100 = KNOWN_GPUS["h100-sxm"]
    target = replace(h100, max_registers=max_registers)
    kept = space(target)
    assert kept
    assert all(c.registers_on(target.arch) <= max_registers for c in kept)
    dropped = [c for c in space(h100) if c not in kept]
    assert all(c.registers_on(target.arch) > max_registers
               or c.shared_bytes > target.shared_bytes for c in dropped)


@needs_nvcc
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("gpu", ["a100", "h100-sxm"])
def test_a_sample_of_the_space_is_within_tolerance_of_ptxas(family, gpu):
    _, space, defaults, split = FAMILIES[family]
    target = KNOWN_GPUS[gpu]
    configs = space(target)
    sample = random.Random(41).sample(configs, 6) + [c for c in defaults if c in configs]
    problems = [m for s in (False, True)[:1 + split]
                for m in misses(family, sample, target.arch, s)]
    assert not problems, f"{STALE}: {problems}"
    spilled = [c for c, facts in zip(sample, reference_counts(sample, target.arch,
                                                              family=family))
               if facts["spills"]]
    assert not spilled


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90"])
def test_every_count_of_the_table_is_within_tolerance_of_ptxas(family, arch):
    candidates, _, _, split = FAMILIES[family]
    configs = sorted({c for g in KNOWN_GPUS.values() for c in candidates(g)},
                     key=lambda c: c.key)
    problems = [m for s in (False, True)[:1 + split]
                for m in misses(family, configs, arch, s)]
    assert not problems, f"{STALE}: {problems[:10]} ({len(problems)} in all)"
