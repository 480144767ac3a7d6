"""The CUDA f32 SIMT MatMul template on awkward shapes (M, N, K in {1, 7, 13, 64, 100,
129}, broadcast batches, 1-D operands), for a seeded sample of the space (every config
with `-m slow`): build -> lower -> print many kernels into two .cu units -> nvcc for
sm_80 (a ptxas error fails; registers <= 255 and no spills per the ptxas report) and
the emulator (g++) -> run each kernel in the emulator on NaN-guarded inputs and a
sentinel-guarded output -> compare with numpy (float64).

Each config runs on two of the shapes (rotating, so every shape meets many configs):
one kernel per (config, shape) keeps the nvcc and g++ work bounded. Builds are
cached by content hash, so reruns only launch kernels."""
from __future__ import annotations

import random
import shutil
from dataclasses import replace

import numpy as np
import pytest
from helpers import targets
from helpers.kernel_device import kernel_module, launch_checked

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources
from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType
from hidetc.schedules.cuda import TEMPLATES, build_kernel
from hidetc.schedules.cuda.gemm_simt import MAX_SPLITS, MIN_SPLIT_TILES
from hidetc.schedules.cuda.matmul_simt import (
    TEMPLATE,
    SimtConfig,
    block_factors,
    check_config,
    config_space,
    default_config,
    for_tiles,
    load_factors,
)
from hidetc.schedules.template import MAX_SPACE
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.evaluate import run_function
from hidetc.tir.ir import cast
from hidetc.tir.pipeline import lower

NVCC = shutil.which("nvcc")
CUDA = targets.CUDA
SHAPES = [((7, 13), (13, 100)), ((129, 64), (64, 7)), ((1, 129), (129, 13)),
          ((100, 1), (1, 129)), ((2, 1, 13, 7), (3, 7, 64)), ((129,), (129, 100)),
          ((64, 100), (100, 64)), ((13, 64), (64,)), ((3, 100, 13), (13, 1)),
          ((7,), (7,))]
GUARD = 64  # floats of NaN around each input, of sentinels around the output
# ptxas, given `__launch_bounds__(threads)`, caps a few kernels at 96 or 128 registers
# (occupancy) and spills a few bytes rather than use more: a choice, not pressure (with
# `__launch_bounds__(threads, 1)` the same kernels take 103..254 registers and never
# spill). Such a spill is tolerated; one near the 255-register limit is not.
CHOSEN_REGISTER_CAP, CHOSEN_SPILL_BYTES = 128, 32
SAMPLE = 30


def matmul_task(a_shape, b_shape) -> Task:
    out = np.matmul(np.zeros(a_shape, np.float32), np.zeros(b_shape, np.float32)).shape
    return Task("MatMul", (TensorType("float32", a_shape), TensorType("float32", b_shape)),
                (TensorType("float32", out),), (), (None, None))


def cases(configs: list[SimtConfig]) -> list[tuple[Task, SimtConfig]]:
    out = []
    for i, cfg in enumerate(configs):
        for s in (2 * i, 2 * i + 1):
            out.append((matmul_task(*SHAPES[s % len(SHAPES)]), cfg))
    return out


def guarded(shape, rng, fill) -> tuple[np.ndarray, np.ndarray]:
    """(buffer with guards, C-contiguous view of `shape` inside it, 256-byte aligned)."""
    size = int(np.prod(shape))
    buf = np.full(size + 2 * GUARD, fill, np.float32)
    view = buf[GUARD:GUARD + size].reshape(shape)
    if fill != fill:  # NaN guards: an input
        view[...] = rng.standard_normal(shape)
    return buf, view


def run_case(module, task: Task, fn, rng) -> None:
    ins = [guarded(t.shape, rng, np.nan)[1] for t in task.inputs]
    out_buf, out = guarded(task.outputs[0].shape, rng, 7.0)
    launch_checked(module, fn, ins + [out])     # split-K: again, in reverse order
    ref = np.matmul(*[x.astype(np.float64) for x in ins])
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-4,
                               err_msg=f"{fn.name}: {task.signature()}")
    assert (out_buf[:GUARD] == 7).all() and (out_buf[GUARD + out.size:] == 7).all()


def check_all(tmp_path, configs: list[SimtConfig]) -> None:
    """Build every (config, shape) into two units; nvcc + ptxas limits; emulate + compare."""
    built = [(task, lower(TEMPLATE.build(task, cfg, f"mm{i}", targets.CUDA)))
             for i, (task, cfg) in enumerate(cases(configs))]
    units = {f"simt{u}": print_cuda_module([fn for _, fn in built[u::2]]) for u in range(2)}
    if NVCC:
        cubins = compile_cubins(units, "sm_80", tmp_path / "cubin", ptx=False,
                                include_dirs=[CUDA_INCLUDE_DIR], keep_logs=True)
        report = {}
        for path in cubins["sm_80"].values():
            report.update(ptxas_resources(path))
        assert set(report) == {fn.name for _, fn in built}
        for name, res in report.items():
            assert res["registers"] <= 255, (name, res)
            assert res["spills"] == 0 or (res["registers"] <= CHOSEN_REGISTER_CAP and
                                          res["spills"] <= CHOSEN_SPILL_BYTES), (name, res)
    module = kernel_module(units)
    rng = np.random.default_rng(0)
    for task, fn in built:
        run_case(module, task, fn, rng)


def sampled_configs() -> list[SimtConfig]:
    """A seeded sample, the two heaviest configs, and split-K (2, 3 and 7 splits: some
    splits of the short-K shapes get no k tile at all)."""
    space = config_space()
    sample = random.Random(0).sample(space, SAMPLE)
    heaviest = sorted(space, key=lambda c: (-c.registers(), str(c)))[:2]
    split = [replace(c, splits=s) for c, s in zip(sample[:3], (2, 3, 7))]
    return sample + [c for c in heaviest if c not in sample] + split


# tests ---------------------------------------------------------------------------------
def test_space_is_hardware_centric_and_fits_the_limits():
    space = TEMPLATE.space(matmul_task((7, 13), (13, 100)), CUDA)
    assert 30 <= len(space) <= MAX_SPACE and len(set(space)) == len(space)
    big = TEMPLATE.space(matmul_task((4096, 4096), (4096, 4096)), CUDA)
    assert [replace(c, splits=1) for c in space] == big == TEMPLATE.space(None, CUDA)
    deep = TEMPLATE.space(matmul_task((64, 4096), (4096, 64)), CUDA)   # few tiles, long K
    assert all(c.splits > 1 for c in deep)
    for cfg in space:
        assert check_config(cfg) is None
        assert cfg.threads <= 1024 and cfg.shared_bytes() <= 48 * 1024
        assert cfg.registers() <= 200
    assert {c.bk for c in space} == {8, 16} and {c.swizzle for c in space} == {1, 8}
    assert check_config(SimtConfig((8, 8), (4, 8), (8, 8), 16, True, 1)) is not None


@pytest.mark.parametrize("m,n,k,batch", [
    (4096, 4096, 4096, 1), (1024, 1024, 1024, 1), (128, 768, 768, 1), (7, 100, 2048, 1),
    (1, 1, 1, 1), (64, 64, 40, 3),
])
@pytest.mark.parametrize("sms", [58, 132])
def test_default_config(m, n, k, batch, sms):
    """The biggest tile that still gives every SM a block (128 x 128 when the problem
    is big), else the smallest, then split-K until every SM has a block, each split
    keeping MIN_SPLIT_TILES k tiles."""
    cfg = default_config(m, n, k, batch, sms)
    tiles = -(-m // cfg.bm) * -(-n // cfg.bn) * batch
    assert replace(cfg, splits=1) in config_space() and 1 <= cfg.splits <= MAX_SPLITS
    if m >= 4096 and n >= 4096:
        assert (cfg.bm, cfg.bn, cfg.splits) == (128, 128, 1)
    if cfg.splits > 1:
        assert tiles * (cfg.splits - 1) < sms and -(-k // cfg.bk) >= cfg.splits * MIN_SPLIT_TILES
    elif tiles < sms:       # unsplit and SMs idle: K too short to share, or the smallest
        assert -(-k // cfg.bk) < 2 * MIN_SPLIT_TILES or cfg.bm * cfg.bn == 2048
    assert TEMPLATES["MatMul"] is TEMPLATE


def test_for_tiles_matches_the_composed_mapping():
    """The helper yields the composed mapping's tasks per worker, and `local` numbers
    each worker's tasks 0..n-1 (checked with the TIR interpreter)."""
    cfg = SimtConfig((2, 2), (8, 4), (8, 4), 8, True, 1)
    for factors in (block_factors(cfg), block_factors(cfg, 4), load_factors(32, 4, 128)):
        composed = factors[0]
        for f in factors[1:]:
            composed = composed * f
        kb = KernelBuilder("tiles")
        owner = kb.buffer("owner", "int32", composed.task_shape)
        with kb.for_range(composed.num_workers, name="w") as w:
            with for_tiles(kb, factors, w) as (idx, local):
                slot = local[0] * 64 + local[1]
                kb.store(owner, idx, cast(w * 1000 + slot, "int32"))
        got = np.full(composed.task_shape, -1, np.int32)
        run_function(lower(kb.finish()), [got])
        for w in range(composed.num_workers):
            tasks = composed.tasks_of(w)
            slots = {int(got[t]) - 1000 * w for t in tasks}
            assert all(got[t] // 1000 == w for t in tasks)
            assert len(slots) == len(tasks)


def test_rule_builds_the_default():
    task = matmul_task((2, 1, 13, 7), (3, 7, 64))
    fn = build_kernel(task, "mm", targets.CUDA)
    assert fn.attr("block")[0] == TEMPLATE.default(task, CUDA).threads


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_default_kernels_of_benchmark_shapes_do_not_spill(tmp_path):
    """The default configs of the bench shapes (bench/cuda_ops.py): strict ptxas check."""
    tasks = [matmul_task((m, k), (k, n)) for m, n, k in
             ((1024, 1024, 1024), (128, 768, 768), (128, 3072, 768), (4096, 4096, 4096))]
    fns = [lower(TEMPLATE.build(t, TEMPLATE.default(t, CUDA), f"big{i}", targets.CUDA))
           for i, t in enumerate(tasks)]
    cubins = compile_cubins({"simt_big": print_cuda_module(fns)}, "sm_80", tmp_path,
                            ptx=False, include_dirs=[CUDA_INCLUDE_DIR], keep_logs=True)
    report = ptxas_resources(cubins["sm_80"]["simt_big"])
    for fn in fns:
        assert report[fn.name]["spills"] == 0 and report[fn.name]["registers"] <= 255


def test_sampled_configs_on_awkward_shapes(tmp_path):
    check_all(tmp_path, sampled_configs())


@pytest.mark.slow
def test_every_config_on_awkward_shapes(tmp_path):
    check_all(tmp_path, config_space())
