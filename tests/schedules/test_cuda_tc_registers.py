"""The tensor-core space's registers per thread follow ptxas (issue 41.2).

`TcConfig.registers_on(arch)` reads `schedules/cuda/tc_registers.json` (ptxas's counts
at the reference task, written by bench/tc_registers.py --write-table). Checked here:
the table covers every candidate of every known GPU; a sample of the space (and every
default) compiled by nvcc today is within TOLERANCE of the table, unsplit and split-K,
on an Ampere and a Hopper arch (the whole table, every arch: `make test-slow`); no
default reaches 255 registers; the space is pruned by those counts at other limits.
"""
from __future__ import annotations

import random
import shutil
from dataclasses import replace

import pytest
from helpers.tc_ptxas import reference_counts

from hidetc.schedules.cuda import tc_registers
from hidetc.schedules.cuda.matmul_tc import DEFAULTS
from hidetc.schedules.cuda.tc_common import TcConfig, tc_candidates, tc_space
from hidetc.target import KNOWN_GPUS

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
TOLERANCE = tc_registers.TOLERANCE
STALE = "the table is stale: run python bench/tc_registers.py --write-table"


def misses(configs: list[TcConfig], arch: str, split: bool) -> list[str]:
    """The configs whose table count is more than TOLERANCE from ptxas's today."""
    counted = reference_counts(configs, arch, split=split)
    return [f"{tc_registers.key_text(c.key)}{' split' if split else ''}: table "
            f"{tc_registers.registers(c.key, split, arch)}, ptxas {facts['registers']}"
            for c, facts in zip(configs, counted)
            if abs(tc_registers.registers(c.key, split, arch) - facts["registers"])
            > TOLERANCE]


def test_the_table_counts_every_candidate_of_every_known_gpu():
    table = tc_registers._table()["archs"]
    for gpu in KNOWN_GPUS.values():
        arch = tc_registers.table_arch(gpu.arch)
        assert arch is not None, gpu.name
        missing = [c for c in tc_candidates(gpu) if tc_registers.key_text(c.key)
                   not in table[arch]]
        assert not missing, (gpu.name, missing[:3])


def test_archs_outside_the_table_take_the_nearest_older_one():
    assert tc_registers.table_arch("sm_87") == "sm_86"
    assert tc_registers.table_arch("sm_90a") == "sm_90"
    assert tc_registers.table_arch("sm_100") == "sm_90"
    assert tc_registers.table_arch("sm_75") is None
    key = DEFAULTS[0].key
    assert tc_registers.registers(key, False, "sm_75") == tc_registers.estimate(key)
    assert DEFAULTS[0].registers_on("sm_90a") == DEFAULTS[0].registers_on("sm_90")


@pytest.mark.parametrize("gpu", sorted(KNOWN_GPUS))
def test_no_default_reaches_the_register_cap(gpu):
    target = KNOWN_GPUS[gpu]
    for cfg in DEFAULTS:
        for splits in (1, 2):
            assert replace(cfg, splits=splits).registers_on(target.arch) < 255, cfg


@pytest.mark.parametrize("gpu", sorted(KNOWN_GPUS))
def test_no_config_of_the_space_spills(gpu):
    """Configs ptxas spilled at the reference (a 512-thread block held to 128
    registers) are out of the space, split-K variants included."""
    target = KNOWN_GPUS[gpu]
    for cfg in tc_space(target):
        assert not cfg.spills_on(target.arch), cfg
    spilling = [c for c in tc_candidates(target) if c.spills_on(target.arch)]
    assert not set(spilling) & set(tc_space(target))


@pytest.mark.parametrize("max_registers", [96, 128, 168])
def test_the_space_is_pruned_by_the_counts_at_other_limits(max_registers):
    """A GPU with fewer registers per thread (a property over limits no GPU here has):
    every config kept is within them by the table's count, and those the count says
    exceed them are dropped even where the old estimate said they fit."""
    target = replace(KNOWN_GPUS["h100-sxm"], max_registers=max_registers)
    space = tc_space(target)
    assert space
    assert all(c.registers_on(target.arch) <= max_registers for c in space)
    dropped = [c for c in tc_space(KNOWN_GPUS["h100-sxm"]) if c not in space]
    assert all(c.registers_on(target.arch) > max_registers
               or c.shared_bytes > target.shared_bytes for c in dropped)


@needs_nvcc
@pytest.mark.parametrize("gpu", ["a100", "h100-sxm"])
def test_a_sample_of_the_space_is_within_tolerance_of_ptxas(gpu):
    target = KNOWN_GPUS[gpu]
    space = tc_space(target)
    sample = random.Random(41).sample(space, 6) + [c for c in DEFAULTS if c in space]
    problems = [m for split in (False, True) for m in misses(sample, target.arch, split)]
    assert not problems, f"{STALE}: {problems}"
    spilled = [c for c, facts in zip(sample, reference_counts(sample, target.arch))
               if facts["spills"]]
    assert not spilled


@pytest.mark.slow
@needs_nvcc
@pytest.mark.parametrize("arch", sorted(tc_registers._table()["archs"]))
def test_every_count_of_the_table_is_within_tolerance_of_ptxas(arch):
    configs = sorted({c for g in KNOWN_GPUS.values() for c in tc_candidates(g)},
                     key=lambda c: c.key)
    problems = [m for split in (False, True) for m in misses(configs, arch, split)]
    assert not problems, f"{STALE}: {problems[:10]} ({len(problems)} in all)"
