"""ptxas's register counts for tensor-core MatMul configs at the reference task of
`schedules.cuda.tc_registers` (what its table holds): the kernels printed as CUDA,
compiled by nvcc for one arch in modules of UNIT kernels through the build cache, the
`-Xptxas -v` report read back. Used by tests/schedules/test_cuda_tc_registers.py and
bench/tc_registers.py (which writes the table)."""
from __future__ import annotations

import tempfile
from dataclasses import replace

from helpers import tasks

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources
from hidetc.schedules.cuda.matmul_tc import build_tc_matmul
from hidetc.schedules.cuda.tc_common import TcConfig
from hidetc.schedules.cuda.tc_registers import REFERENCE, REFERENCE_SPLITS
from hidetc.tir.pipeline import lower

UNIT = 8


def reference_counts(configs: list[TcConfig], arch: str,
                     split: bool = False) -> list[dict[str, int]]:
    """Per config (in order): ptxas's {registers, spills, ...} on `arch` for its
    reference kernel, split-K (REFERENCE_SPLITS) when `split`."""
    m, n, k, dtype = REFERENCE
    task = tasks.matmul_task((m, k), (k, n), dtype)
    splits = REFERENCE_SPLITS if split else 1
    fns = [lower(build_tc_matmul(task, replace(c, splits=splits), f"tc_{i}"))
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
