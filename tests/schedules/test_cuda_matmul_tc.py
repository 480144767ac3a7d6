"""The f16 tensor-core MatMul template (hidetc/schedules/cuda/matmul_tc.py).

Layout facts in Python (the XOR swizzle is a bank-conflict-free permutation, the C
fragment mapping is the PTX one), then kernels: a seeded sample of configs on awkward
shapes (M, N, K in {1, 8, 13, 16, 50, 64, 100, 129}, batched and broadcast, 1-D
operands, K = 0 and M = 0, row lengths that force the 8-byte, 4-byte and scalar copy fallbacks) is
built, lowered and printed into two translation units, compiled by nvcc for sm_80 and
sm_90 (ptxas errors fail) and run in the emulator on float16 inputs against numpy in
float32 from the same inputs: the documented f16 tolerance (norm-wise 1e-2) and,
stricter, every element within the f16 output rounding, no element left unwritten and
nothing written past the output. Split-K configs (`SPLIT_CASES`) run a second time with
the blocks and threads in reverse order and must give the same bits and leave their arrival
counters zero. Every config runs under `-m slow`.
"""
from __future__ import annotations

import itertools
import random
from dataclasses import replace

import numpy as np
import pytest
from helpers import targets, tasks
from helpers.f16_matmul import check_f16_matmul
from helpers.kernel_device import kernel_module

from hidetc.backends.codegen.cuda import (
    CUDA_INCLUDE_DIR,
    dynamic_shared_bytes,
    print_cuda_module,
)
from hidetc.backends.toolchain.nvcc import compile_cubins, find_nvcc, ptxas_resources
from hidetc.compute.task import Task
from hidetc.errors import ToolchainError
from hidetc.schedules.cuda import cost
from hidetc.schedules.cuda.matmul_tc import (
    C_FRAGMENT,
    C_PAIRS,
    DEFAULTS,
    TEMPLATE,
    SwizzledTile,
    TcConfig,
    chunk_mapping,
    copy_width,
    cost_gemm,
    fits,
    geometry,
    xor_bits,
)
from hidetc.schedules.template import MAX_SPACE
from hidetc.tir.pipeline import lower

ARCHS = ("sm_80", "sm_90")
TARGET = targets.CUDA
SPACE = TEMPLATE.space(None, TARGET)
SAMPLE = random.Random(0).sample(SPACE, 32)
# (A shape, B shape): awkward M, N, K; K or N % 8 in {4: cp.async8, 2: cp.async4, odd: scalar}
SHAPES = (
    ((100, 64), (64, 129)), ((13, 13), (13, 8)), ((129, 100), (100, 16)),
    ((2, 3, 16, 50), (3, 50, 64)), ((1, 129), (129, 100)), ((64, 8), (8, 50)),
    ((8, 1), (1, 13)), ((129,), (129, 64)), ((2, 64, 16), (16,)), ((16, 24), (2, 24, 100)),
    ((5, 0), (0, 7)), ((0, 8), (8, 16)),
)

try:
    NVCC = find_nvcc()
except ToolchainError:
    NVCC = None
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not found")


def matmul_task(a_shape, b_shape) -> Task:
    return tasks.matmul_task(a_shape, b_shape, "float16")


# ---------------------------------------------------------------- space and layouts

def test_space_is_hardware_centric():
    assert 30 < len(SPACE) <= MAX_SPACE and len(set(SPACE)) == len(SPACE)
    for cfg in SPACE:
        assert fits(cfg, TARGET)
        assert cfg.threads <= 1024 and cfg.shared_bytes <= TARGET.shared_optin_bytes
        assert cfg.registers_on(TARGET.arch) <= 255
        assert cfg.bm % (16 * cfg.wm) == 0 and cfg.nt % 2 == 0
        assert 32 <= (cfg.stages - 1) * cfg.bk <= 192          # K in flight
        if cfg.shared_bytes > 48 * 1024:                         # dynamic shared memory:
            assert cfg.stages >= 3 and min(cfg.bm, cfg.bn) >= 64 and cfg.threads <= 256
    assert any(c.shared_bytes > 48 * 1024 for c in SPACE)      # deep pipelines, big tiles
    # per task: the same tiles, each at the split-K the cost model picks, cheapest first
    task = matmul_task((49, 4608), (4608, 512))
    space = TEMPLATE.space(task, TARGET)
    assert len(space) == len(SPACE) and {replace(c, splits=1) for c in space} == set(SPACE)
    assert all(fits(c, TARGET) for c in space) and any(c.splits > 1 for c in space)
    gemm = cost_gemm(task)
    times = [cost.gemm_estimate(gemm, c, TARGET).estimate_us for c in space]
    assert times == sorted(times)
    assert {c.stages for c in SPACE} == {2, 3, 4} and {c.bk for c in SPACE} == {16, 32, 64}


def test_default_config():
    """The cost model's pick among DEFAULTS: the big tile, unsplit, where the tiles fill
    the GPU many times over; a split K where few tiles would leave most SMs idle (so
    the launch fills at least most of them); always a config of the task's space."""
    big = matmul_task((4096, 4096), (4096, 4096))
    assert TEMPLATE.default(big, TARGET) == DEFAULTS[0] == TcConfig(128, 128, 32, 2, 2, 3)
    assert all(d in SPACE for d in DEFAULTS)
    for a, b in (((49, 4608), (4608, 512)), ((128, 3072), (3072, 768)), ((1, 2048), (2048, 1000)),
                 ((13, 64), (64, 8))):
        task = matmul_task(a, b)
        cfg = TEMPLATE.default(task, TARGET)
        assert replace(cfg, splits=1) in DEFAULTS and fits(cfg, TARGET)
        estimate = cost.gemm_estimate(cost_gemm(task), cfg, TARGET)
        if a[-1] >= 2048:                 # long K, few tiles: split
            assert cfg.splits > 1 and estimate.blocks >= 0.9 * TARGET.sms, (a, b, cfg)


def test_xor_bits_is_xor():
    for x, key, bits in itertools.product(range(40), range(8), (1, 2, 3)):
        if key < 1 << bits:
            assert xor_bits(x, key, bits) == x ^ key


TILES = sorted({(c.bm, c.bk) for c in SPACE} | {(c.bk, c.bn) for c in SPACE})


@pytest.mark.parametrize("rows,cols", TILES)
def test_swizzle_is_a_conflict_free_permutation(rows, cols):
    tile = SwizzledTile(rows, cols)
    chunks = [[tile.offset(r, c) // 8 for c in range(tile.chunks)] for r in range(rows)]
    for r, row in enumerate(chunks):  # a permutation of the row's own chunks
        assert sorted(row) == list(range(r * tile.chunks, (r + 1) * tile.chunks))
        assert row == [tile.offset(r, c, key_row=r % 8) // 8 for c in range(tile.chunks)]
    # ldmatrix: 8 consecutive rows (from a multiple of 8) at one logical chunk -> the 8
    # row addresses hit 8 distinct 16-byte bank groups (address in chunks mod 8)
    for r0, c in itertools.product(range(0, rows, 8), range(tile.chunks)):
        assert len({chunks[r0 + i][c] % 8 for i in range(8)}) == 8


@pytest.mark.parametrize("cfg", sorted({(c.bm, c.bk, c.threads) for c in SPACE}
                                       | {(c.bk, c.bn, c.threads) for c in SPACE}))
def test_cp_async_stores_are_conflict_free(cfg):
    """Each quarter warp (8 lanes x 16 bytes, one shared-memory wavefront) writes 8
    distinct bank groups, and the mapping covers every chunk exactly once."""
    rows, cols, threads = cfg
    tile = SwizzledTile(rows, cols)
    mapping = chunk_mapping(rows, tile.chunks, threads)
    tasks = [mapping.tasks_of(t) for t in range(threads)]
    for step in range(len(tasks[0])):
        for q in range(0, threads, 8):
            groups = [tile.offset(*tasks[t][step]) // 8 % 8 for t in range(q, q + 8)
                      if len(tasks[t]) > step]
            assert len(set(groups)) == len(groups)
    seen = sorted(task for ts in tasks for task in ts)
    assert seen == sorted(itertools.product(range(rows), range(tile.chunks)))


def test_c_fragment_mapping_is_the_ptx_layout():
    """mma.m16n8k16 C/D: lane l = 4 g + t holds c0..c3 = (g, 2t), (g, 2t+1), (g+8, 2t),
    (g+8, 2t+1); the kernel reads register (row // 8) * 2 + col % 2 of each task."""
    assert C_FRAGMENT.num_workers == 32 and C_FRAGMENT.task_shape == (16, 8)
    for lane in range(32):
        g, t = divmod(lane, 4)
        ptx = [(g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1)]
        tasks = C_FRAGMENT.tasks_of(lane)
        assert sorted(tasks) == sorted(ptx)
        assert all(ptx[r // 8 * 2 + c % 2] == (r, c) for r, c in tasks)
        assert [(r, 2 * c) for r, c in C_PAIRS.tasks_of(lane)] == ptx[::2]


# ---------------------------------------------------------------- kernels

# split-K on awkward shapes: K prime, K in fewer k tiles than splits (empty splits), M = 1,
# batched with broadcast, K = 0, an odd N (scalar stores), a split that is the tile's only
# difference from DEFAULTS[0]
SPLIT_CASES = (
    (((13, 211), (211, 24)), TcConfig(32, 32, 16, 1, 1, 3, splits=3)),
    (((5, 8), (8, 7)), TcConfig(32, 32, 16, 1, 1, 2, splits=4)),
    (((1, 129), (129, 100)), TcConfig(64, 32, 32, 2, 1, 4, splits=3)),
    (((2, 3, 16, 50), (3, 50, 64)), TcConfig(32, 64, 16, 1, 2, 2, splits=2)),
    (((5, 0), (0, 7)), TcConfig(32, 32, 16, 1, 1, 2, splits=2)),
    (((37, 300), (300, 53)), TcConfig(64, 64, 32, 2, 2, 4, splits=5)),
    (((100, 512), (512, 129)), replace(DEFAULTS[0], splits=4)),
)


def build_cases(configs) -> list[tuple[str, Task, TcConfig, object]]:
    """Each config on one shape (cycling), the default config on every shape, and the
    split-K cases."""
    cases = [(SHAPES[i % len(SHAPES)], cfg) for i, cfg in enumerate(configs)]
    cases += [(shape, DEFAULTS[0]) for shape in SHAPES] + list(SPLIT_CASES)
    out = []
    for i, (shape, cfg) in enumerate(cases):
        task = matmul_task(*shape)
        out.append((f"tc{i}", task, cfg, lower(TEMPLATE.build(task, cfg, f"tc{i}", targets.CUDA))))
    return out


def sources(cases, units: int = 2) -> dict[str, str]:
    return {f"tc_unit{u}": print_cuda_module([fn for _, _, _, fn in cases[u::units]])
            for u in range(units)}


def run_case(module, task: Task, fn, rng) -> None:
    check_f16_matmul(module, task, fn, rng, f"{fn.name}: {task.signature()}")


def run_all(cases) -> None:
    module = kernel_module(sources(cases))
    rng = np.random.default_rng(0)
    for _, task, _, fn in cases:
        run_case(module, task, fn, rng)


@pytest.fixture(scope="module")
def cases():
    return build_cases(SAMPLE)


def test_sample_in_emulator(cases):
    run_all(cases)


def check_ptxas(cases, cubins) -> None:
    """Every kernel compiled for every arch with its shared memory; no spills for the
    default config and the 16-byte copy path (the scalar fallback of a big tile, e.g.
    N = 1 with BN = 256, may spill a few bytes: 12 on sm_90 for one config)."""
    for arch in ARCHS:
        report = {}
        for path in cubins[arch].values():
            report.update(ptxas_resources(path))
        assert set(report) == {name for name, _, _, _ in cases}
        for name, task, cfg, fn in cases:
            res, geo = report[name], geometry(task)
            used = geo.k > 0 and task.outputs[0].size > 0     # else no tile is loaded
            if used:     # ptxas reports static shared memory; dynamic past 48 KiB
                static = cfg.shared_bytes if cfg.shared_bytes <= 48 * 1024 else 0
                assert res["shared_bytes"] == static, name
                assert dynamic_shared_bytes(fn) == cfg.shared_bytes - static, name
            else:     # no tile loaded: none, or split-K's flag in the A tile's first half
                assert res["shared_bytes"] <= (cfg.shared_bytes if cfg.splits > 1 else 0)
            assert res["registers"] <= min(255, 65536 // cfg.threads), (arch, name, res)
            fast = copy_width(geo.k) == copy_width(geo.n) == 8
            limit = 0 if fast or cfg == DEFAULTS[0] else 64
            assert res["stack_bytes"] <= limit and res["spills"] <= limit, (arch, name, res)


@needs_nvcc
def test_nvcc_compiles_without_spills(cases, tmp_path):
    """sm_80 and sm_90 (ptxas errors fail); the default config included on every shape."""
    cubins = compile_cubins(sources(cases), ARCHS, tmp_path, include_dirs=[CUDA_INCLUDE_DIR],
                            ptx=False, keep_logs=True)
    check_ptxas(cases, cubins)


@pytest.mark.slow
def test_every_config_in_emulator_and_nvcc(tmp_path):
    cases = build_cases(SPACE)
    run_all(cases)
    if NVCC is not None:
        cubins = compile_cubins(sources(cases, units=4), ARCHS, tmp_path, ptx=False,
                                include_dirs=[CUDA_INCLUDE_DIR], keep_logs=True)
        check_ptxas(cases, cubins)
