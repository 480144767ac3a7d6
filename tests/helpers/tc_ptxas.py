"""ptxas's register counts for tensor-core MatMul configs at the reference tasks of
`schedules.cuda.tc_registers` (what its table holds, per family: "half" -- `matmul_tc`
-- and "int8" -- `matmul_int8_tc`): the kernels printed as CUDA,
compiled by nvcc for one arch in modules of UNIT kernels through the build cache, the
`-Xptxas -v` report read back. Used by tests/schedules/test_cuda_tc_registers.py and
bench/tc_registers.py (which writes the table)."""
from __future__ import annotations

import tempfile
from dataclasses import replace

from helpers import tasks

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources
from hidetc.schedules.cuda.matmul_int8_tc import build_int8_tc_matmul
from hidetc.schedules.cuda.matmul_tc import build_tc_matmul
from hidetc.schedules.cuda.tc_registers import FAMILIES, REFERENCE_SPLITS
from hidetc.tir.ir import Function
from hidetc.tir.pipeline import lower

UNIT = 8


def reference_kernel(family: str, config, name: str) -> Function:
    """The family's reference kernel of `config`, lowered."""
    m, n, k = FAMILIES[family]["m_n_k"]
    if family == "half":
        return lower(build_tc_matmul(tasks.matmul_task((m, k), (k, n), "float16"), config,
                                     name))
    a, b = FAMILIES[family]["types"]        # MatMulInteger with per-tensor zero points
    task = tasks.matmul_integer_task((m, k), (k, n), a, b, az=True, bz=())
    return lower(build_int8_tc_matmul(task, config, name))


def reference_counts(configs: list, arch: str, split: bool = False,
                     family: str = "half") -> list[dict[str, int]]:
    """Per config (in order): ptxas's {registers, spills, ...} on `arch` for its
    reference kernel of `family`, split-K (REFERENCE_SPLITS) when `split`."""
    splits = REFERENCE_SPLITS if split else 1
    fns = [reference_kernel(family, replace(c, splits=splits), f"tc_{i}")
           for i, c in enumerate(configs)]
    sources = {f"unit{u}": print_cuda_module(fns[u * UNIT:(u + 1) * UNIT])
               for u in range((len(fns) + UNIT - 1) // UNIT)}
    facts: dict[str, dict[str, int]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        built = compile_cubins(sources, [arch], tmp, include_dirs=[CUDA_INCLUDE_DIR],
                               ptx=False, keep_logs=True)
        for path in built[arch].values():
            facts.update(ptxas_resources(path))
    return [facts[f"tc_{i}"] for i in range(len(configs))]
