"""The f16 small-M MatMul template (hidetc/schedules/cuda/matmul_gemv.py).

The space and the selection in Python (the cost model takes it for a classifier head,
the tensor cores for many rows), then kernels: every config of the space on a cycle of
awkward shapes (M in {1, 3, 16}, N odd or not a multiple of 8, K prime, K = 0, batched
with broadcast, 1-D operands), built, lowered and printed into two translation units,
compiled by nvcc for sm_80 and sm_90 (no spills) and run in the emulator on float16
inputs against numpy in float32 from the same inputs: every element within f16 output
rounding (1e-3 |ref| + 1e-4 x the output's scale), the norm-wise error within the
documented f16 tolerance 1e-2, no element left unwritten, nothing written past the
output.
"""
from __future__ import annotations

import numpy as np
import pytest
from helpers import targets, tasks
from helpers.f16_matmul import check_f16_matmul
from helpers.kernel_device import kernel_module

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.toolchain.nvcc import compile_cubins, find_nvcc, ptxas_resources
from hidetc.compute.task import Task
from hidetc.errors import ToolchainError
from hidetc.schedules.cuda import kernel_choice, matmul_tc
from hidetc.schedules.cuda.matmul_gemv import SMALL_M, TEMPLATE, GemvConfig, applies, fits
from hidetc.schedules.template import MAX_SPACE
from hidetc.target import KNOWN_GPUS
from hidetc.tir.pipeline import lower

TARGET = targets.CUDA
SPACE = TEMPLATE.space(None, TARGET)
SHAPES = (
    ((1, 211), (211, 100)), ((3, 37), (37, 13)), ((16, 100), (100, 64)),
    ((2048,), (2048, 24)), ((2, 3, 5, 40), (3, 40, 17)), ((4, 0), (0, 9)),
    ((1, 64), (64,)), ((1, 300), (2, 300, 72)), ((7, 129), (129, 8)),
)

try:
    NVCC = find_nvcc()
except ToolchainError:
    NVCC = None


def matmul_task(a_shape, b_shape) -> Task:
    return tasks.matmul_task(a_shape, b_shape, "float16")


def test_space_and_selection():
    assert 10 <= len(SPACE) <= MAX_SPACE and len(set(SPACE)) == len(SPACE)
    for gpu in ("a100", "l4", "h200"):
        assert all(fits(c, SMALL_M, KNOWN_GPUS[gpu]) for c in TEMPLATE.space(None, KNOWN_GPUS[gpu]))
    head = matmul_task((1, 2048), (2048, 1000))          # a classifier head: streams weights
    template, cfg = kernel_choice(head, TARGET)
    assert template is TEMPLATE and cfg == TEMPLATE.space(head, TARGET)[0]
    rows = matmul_task((128, 768), (768, 768))            # many rows: tensor cores
    assert kernel_choice(rows, TARGET)[0] is matmul_tc.TEMPLATE and not applies(rows)
    assert applies(matmul_task((16, 8), (8, 8))) and not applies(matmul_task((17, 8), (8, 8)))
    with pytest.raises(ValueError, match="M <= 16"):
        TEMPLATE.build(matmul_task((17, 8), (8, 8)), SPACE[0], "k", TARGET)


def build_cases():
    cases = [(SHAPES[i % len(SHAPES)], cfg) for i, cfg in enumerate(SPACE)]
    cases += [(shape, GemvConfig(1, 2, 1)) for shape in SHAPES]
    out = []
    for i, (shape, cfg) in enumerate(cases):
        task = matmul_task(*shape)
        out.append((f"gv{i}", task, cfg, lower(TEMPLATE.build(task, cfg, f"gv{i}", TARGET))))
    return out


@pytest.fixture(scope="module")
def cases():
    return build_cases()


def sources(cases, units: int = 2) -> dict[str, str]:
    return {f"gv_unit{u}": print_cuda_module([fn for _, _, _, fn in cases[u::units]])
            for u in range(units)}


def test_every_config_in_emulator(cases):
    module = kernel_module(sources(cases))
    rng = np.random.default_rng(0)
    for _, task, cfg, fn in cases:
        check_f16_matmul(module, task, fn, rng, f"{fn.name} {cfg}: {task.signature()}")


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
def test_nvcc_compiles_without_spills(cases, tmp_path):
    cubins = compile_cubins(sources(cases), ("sm_80", "sm_90"), tmp_path, ptx=False,
                            include_dirs=[CUDA_INCLUDE_DIR], keep_logs=True)
    for arch, built in cubins.items():
        report = {}
        for path in built.values():
            report.update(ptxas_resources(path))
        assert set(report) == {name for name, _, _, _ in cases}
        for name, task, cfg, _ in cases:
            res = report[name]
            assert res["spills"] == 0 and res["registers"] <= 255, (arch, name, cfg, res)
