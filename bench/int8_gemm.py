"""hidetc's int8 MatMulInteger kernel on a 1024^3 product beside this core's int8 peaks
(issue 38: "the int8 GEMM micro-kernel at >= 80% of this CPU's vpdpbusd peak on a
1024^3 matmul (peak measured with a tight loop, both reported)").

    python bench/int8_gemm.py [--n 1024] [--cores 1] [--seconds 0.5] [--out RESULT.json]

The kernel is what a quantized model's compile builds for a MatMulInteger with constant
int8 weights (`cpu.matmul.int8`: uint8 A with a zero point, weights packed at compile
time, A packed inside the timed call, the zero-point correction in the store), for a
target of `--cores` cores on each block helper this CPU has (AMX-INT8 tiles, AVX512_VNNI,
AVX-VNNI, exact AVX2), every config of the space timed and the default's and the best's
GOP/s reported (2 ops per multiply-add); the peaks are `bench/cpu_peak.py`'s tight
`vpdpbusd` loops, measured in the same run (per core: `--cores 1` compares like with
like). The result is checked against the exact integer product.
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
from hidetc.schedules.cpu import matmul_int8  # noqa: E402
from hidetc.schedules.cpu.gemm_int8 import int8_space  # noqa: E402
from hidetc.target import CpuTarget  # noqa: E402
from hidetc.tir.pipeline import lower  # noqa: E402

# the helper each feature set runs (gemm_int8.block_call) and the peak it is judged by
PATHS = ((("amx_int8", "avx512_vnni"), "amx", "int8_amx_gops"),
         (("avx512_vnni",), "vnni", "int8_vnni_gops"),
         (("avx_vnni",), "avxvnni", "int8_avxvnni_gops"),
         ((), "avx2", None))


def task_of(n: int) -> Task:
    a, b = TensorType("uint8", (n, n)), TensorType("int8", (n, n))
    zero = TensorType("uint8", ())
    return Task("MatMulInteger", (a, b, zero), (TensorType("int32", (n, n)),), (),
                (None, None, None))


def time_configs(n: int, features: tuple, cores: int, seconds: float) -> dict:
    task = task_of(n)
    isa = "avx512" if "avx512f" in cpu_isa.host_flags() else "avx2"
    target = CpuTarget(isa=isa, cores=cores, features=features)
    configs = int8_space()
    default = matmul_int8.TEMPLATE.default(task, target)
    fns = {f"k{i}": matmul_int8.TEMPLATE.build(task, c, f"k{i}", target, prepacked=True)
           for i, c in enumerate(configs)}
    with tempfile.TemporaryDirectory() as tmp:
        lib = ctypes.CDLL(str(build_shared_library(
            {name: print_c_module([lower(fn)]) for name, fn in fns.items()},
            Path(tmp) / "gemm.so")))
    rng = np.random.default_rng(0)
    a = rng.integers(0, 255, (n, n), endpoint=True).astype(np.uint8)
    b = rng.integers(-128, 127, (n, n), endpoint=True).astype(np.int8)
    zero = np.array([7], np.uint8)
    packed = matmul_int8.prepack_weights(task, default, b)
    out = np.empty((n, n), np.int32)
    args = [x.ctypes.data_as(ctypes.c_void_p) for x in (a, packed, zero, out)]
    rates = {}
    for (name, _), cfg in zip(fns.items(), configs):
        kernel = getattr(lib, name)
        kernel(*args)
        calls = max(1, int(seconds / 5 / max(cpu_peak.seconds_per_call(kernel, args), 1e-6)))
        best = min(cpu_peak.seconds_per_call(kernel, args, calls) for _ in range(5))
        rates[cfg] = 2 * n ** 3 / best / 1e9
    getattr(lib, list(fns)[configs.index(default)])(*args)
    exact = (a.astype(np.int64) - 7) @ b.astype(np.int64)
    best = max(rates, key=rates.get)
    return {"features": list(features), "default": str(default),
            "default_gops": rates[default], "best": str(best), "best_gops": rates[best],
            "exact": bool(np.array_equal(out, exact))}


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
    flags = cpu_isa.host_flags()
    for features, helper, peak_key in PATHS:
        if not all(f in flags for f in features):
            continue
        row = {"helper": helper, **time_configs(a.n, features, a.cores, a.seconds)}
        peak = peaks.get(peak_key) if peak_key else None
        if peak:
            row["default_of_peak"] = row["default_gops"] / (peak * a.cores)
            row["best_of_peak"] = row["best_gops"] / (peak * a.cores)
        row["best_over_f32_fma_peak"] = row["best_gops"] / (peaks["f32_fma_gflops"] * a.cores)
        result["kernels"].append(row)
    return cpu_peak.report(result, a.out)


if __name__ == "__main__":
    sys.exit(main())
