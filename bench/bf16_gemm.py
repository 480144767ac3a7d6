"""hidetc's bf16 MatMul kernel on a 1024^3 product beside this core's bf16 peaks (issue 37:
"the GEMM micro-kernel at >= 80% of the bf16 peak on a 1024^3 matmul").

    python bench/bf16_gemm.py [--n 1024] [--cores 1] [--seconds 0.5] [--out RESULT.json]

The kernel is what a `--precision bf16` compile builds for a MatMul with constant
weights (`cpu.matmul.bf16`, weights packed at compile time, A rounded while packed
inside the timed call), for a target of `--cores` cores on each block helper this CPU
has (AMX-BF16 tiles; AVX512_BF16 `vdpbf16ps`), every config of the space timed and the
default's and the best's GFLOP/s reported; the peaks are `bench/cpu_peak.py`'s, measured
in the same run (one core: the peak is per core, so `--cores 1` compares like with
like). The result is checked against the bf16-rounded product.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench import cpu_peak  # noqa: E402
from hidetc import cpu_isa  # noqa: E402
from hidetc.backends.codegen.c import print_c_module  # noqa: E402
from hidetc.backends.toolchain.gcc import build_shared_library  # noqa: E402
from hidetc.compute.task import Task  # noqa: E402
from hidetc.graph.ir import TensorType  # noqa: E402
from hidetc.graph.ops.registry import get_op  # noqa: E402
from hidetc.schedules.cpu import matmul_bf16  # noqa: E402
from hidetc.schedules.cpu.gemm_bf16 import bf16_space  # noqa: E402
from hidetc.target import CpuTarget  # noqa: E402
from hidetc.tir.pipeline import lower  # noqa: E402


def task_of(n: int) -> Task:
    t = TensorType("float32", (n, n))
    return Task("MatMul", (t, t), (t,), (("compute", "bfloat16"),), (None, None))


def time_configs(n: int, features: tuple, cores: int, seconds: float) -> dict:
    task = task_of(n)
    target = CpuTarget(isa="avx512", cores=cores, features=features)
    configs = bf16_space()
    default = matmul_bf16.TEMPLATE.default(task, target)
    fns = {f"k{i}": matmul_bf16.TEMPLATE.build(task, c, f"k{i}", target, prepacked=True)
           for i, c in enumerate(configs)}
    with tempfile.TemporaryDirectory() as tmp:
        lib = ctypes.CDLL(str(build_shared_library(
            {name: print_c_module([lower(fn)]) for name, fn in fns.items()},
            Path(tmp) / "gemm.so")))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    packed = matmul_bf16.prepack_weights(task, default, b).view(np.uint16)
    out = np.empty((n, n), np.float32)
    args = [x.ctypes.data_as(ctypes.c_void_p) for x in (a, packed, out)]
    rates = {}
    for (name, _), cfg in zip(fns.items(), configs):
        kernel = getattr(lib, name)
        kernel(*args)
        calls = max(1, int(seconds / 5 / max(cpu_peak.seconds_per_call(kernel, args), 1e-6)))
        best = min(cpu_peak.seconds_per_call(kernel, args, calls) for _ in range(5))
        rates[cfg] = 2 * n ** 3 / best / 1e9
    ref = get_op("MatMul").reference([a, b], {"compute": "bfloat16"})[0]
    getattr(lib, list(fns)[configs.index(default)])(*args)
    err = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    best = max(rates, key=rates.get)
    return {"features": list(features), "default": str(default),
            "default_gflops": rates[default], "best": str(best), "best_gflops": rates[best],
            "norm_rel_err_vs_bf16_reference": err}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--cores", type=int, default=1)
    p.add_argument("--seconds", type=float, default=0.5)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(a.cores))
    peaks = cpu_peak.measure(a.seconds)
    result = {"n": a.n, "cores": a.cores, "peaks": peaks, "kernels": []}
    host = cpu_isa.host_features()
    paths = [f for f in (("avx512_bf16", "amx_bf16"), ("avx512_bf16",))
             if all(x in host for x in f)]
    for features in paths:
        row = time_configs(a.n, features, a.cores, a.seconds)
        peak = peaks.get("amx_bf16_gflops" if "amx_bf16" in features else "bf16_dp_gflops")
        if peak:
            row["default_of_peak"] = row["default_gflops"] / (peak * a.cores)
            row["best_of_peak"] = row["best_gflops"] / (peak * a.cores)
        row["best_over_f32_fma_peak"] = row["best_gflops"] / (peaks["f32_fma_gflops"] *
                                                               a.cores)
        result["kernels"].append(row)
    return cpu_peak.report(result, a.out)


if __name__ == "__main__":
    sys.exit(main())
