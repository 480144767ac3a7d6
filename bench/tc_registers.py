"""The tensor-core space's register estimate beside ptxas's count.

    python bench/tc_registers.py [--arch sm_90] [--gpu h100-sxm] [--json FILE]

Every config of the MatMul tensor-core space (`tc_common.tc_space` for the GPU's
limits) built for one task (M = N = K = 1024, f16; no split), printed as CUDA, compiled
by nvcc for `--arch` (units of 8 kernels, through the build cache) with the ptxas
report kept; per config the estimate (`TcConfig.registers`) and ptxas's registers and
spills. What `tests/schedules/test_cuda_tc_registers.py` checks, on a sample of the
space, and what the estimate's constants were fitted to.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import tasks  # noqa: E402

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module  # noqa: E402
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources  # noqa: E402
from hidetc.schedules.cuda.matmul_tc import build_tc_matmul  # noqa: E402
from hidetc.schedules.cuda.tc_common import tc_space  # noqa: E402
from hidetc.target import KNOWN_GPUS  # noqa: E402
from hidetc.tir.pipeline import lower  # noqa: E402

UNIT = 8


def ptxas_counts(configs: list, arch: str, shape=(1024, 1024, 1024)) -> list[dict]:
    """Per config: {config, estimate, registers, spills} (ptxas on `arch`)."""
    m, n, k = shape
    task = tasks.matmul_task((m, k), (k, n), "float16")
    fns = [lower(build_tc_matmul(task, replace(c, splits=1), f"tc_{i}"))
           for i, c in enumerate(configs)]
    sources = {f"unit{u}": print_cuda_module(fns[u * UNIT:(u + 1) * UNIT])
               for u in range((len(fns) + UNIT - 1) // UNIT)}
    with tempfile.TemporaryDirectory() as tmp:
        built = compile_cubins(sources, [arch], tmp, include_dirs=[CUDA_INCLUDE_DIR],
                               ptx=False, keep_logs=True)
        facts = {}
        for path in built[arch].values():
            facts.update(ptxas_resources(path))
    return [{"config": repr(c), "estimate": c.registers,
             "registers": facts[f"tc_{i}"]["registers"],
             "spills": facts[f"tc_{i}"]["spills"]} for i, c in enumerate(configs)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    configs = tc_space(KNOWN_GPUS[args.gpu])
    rows = ptxas_counts(configs, args.arch)
    worst = max(rows, key=lambda r: abs(r["estimate"] - r["registers"]))
    print(f"{len(rows)} configs; worst miss {worst['estimate'] - worst['registers']:+d} "
          f"({worst['config']}: estimate {worst['estimate']}, ptxas {worst['registers']})")
    if args.json:
        Path(args.json).write_text(json.dumps({"arch": args.arch, "gpu": args.gpu,
                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
