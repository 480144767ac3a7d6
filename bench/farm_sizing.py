"""What one tuning candidate costs to build and to measure on this machine: the figures
the README's "Sizing a farm" works from.

    python bench/farm_sizing.py [--models bert_base,resnet50] [--space 1] [--json FILE]

Per tiny benchmark model, the cpu target, tuned at `--space` with fresh records twice:
first with an empty build cache (every candidate built and measured), then with the
build cache the first run filled (measured only). Reported per model: candidates, the
two tuning times, and per candidate the build seconds (the difference over the
candidates, times the build jobs that ran in parallel: CPU-seconds) and the measuring
seconds. Then the cuda target's build alone (no GPU here: `--no-tune`, an empty build
cache): nvcc seconds per distinct kernel, what a cuda candidate costs a build node.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hidetc  # noqa: E402
import models  # noqa: E402
from hidetc.driver.tune.common import default_jobs  # noqa: E402


def _tune(path: Path, out: Path, cache: Path, records: Path, space: int) -> dict:
    os.environ["HIDETC_CACHE_DIR"] = str(cache)
    start = time.perf_counter()
    result = hidetc.compile_model(path, out, target="cpu", tune=True, space=space,
                                  records=str(records), verify=False)
    tuning = result.manifest["tuning"]
    return {"seconds": time.perf_counter() - start, "tuning_s": tuning["seconds"],
            "candidates": tuning["candidates"], "tasks": tuning["tasks"]}


def cpu_row(name: str, space: int, work: Path) -> dict:
    path = work / f"{name}.onnx"
    models.save(models.build(name, tiny=True), path)
    cache = work / f"cache-{name}"
    cold = _tune(path, work / f"{name}.cold", cache, work / f"{name}-1.sqlite", space)
    warm = _tune(path, work / f"{name}.warm", cache, work / f"{name}-2.sqlite", space)
    n = max(cold["candidates"], 1)
    jobs = default_jobs()
    return {"model": name, "space": space, "tasks": cold["tasks"], "candidates": n,
            "cold_tuning_s": cold["tuning_s"], "warm_tuning_s": warm["tuning_s"],
            "build_cpu_s_per_candidate": (cold["tuning_s"] - warm["tuning_s"]) * jobs / n,
            "measure_s_per_candidate": warm["tuning_s"] / n, "build_jobs": jobs}


def cuda_row(name: str, work: Path) -> dict:
    path = work / f"{name}.onnx"
    if not path.is_file():
        models.save(models.build(name, tiny=True), path)
    os.environ["HIDETC_CACHE_DIR"] = str(work / f"cache-cuda-{name}")
    start = time.perf_counter()
    result = hidetc.compile_model(path, work / f"{name}.cuda", target="cuda", tune=False,
                                  precision="f16", verify=False)
    seconds = time.perf_counter() - start
    kernels = len({k["name"] for k in result.manifest["kernels"]})
    return {"model": name, "target": "cuda", "compile_s": seconds, "distinct_kernels": kernels,
            "build_s_per_kernel": seconds / max(kernels, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert_base,resnet50")
    parser.add_argument("--space", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="hidetc-sizing-") as tmp:
        work = Path(tmp)
        for name in args.models.split(","):
            rows.append(cpu_row(name, args.space, work))
            print(json.dumps(rows[-1]), flush=True)
            rows.append(cuda_row(name, work))
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
