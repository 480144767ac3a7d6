"""ptxas's register counts for the tensor-core space, and the table the space is pruned by.

    python bench/tc_registers.py [--arch sm_90] [--gpu h100-sxm] [--json FILE]
    python bench/tc_registers.py --write-table [--archs sm_80,sm_86,sm_89,sm_90]

The first form: every config of the MatMul tensor-core space (`tc_common.tc_space` for
the GPU's limits) built for the reference task of `schedules/cuda/tc_registers.py`
(unsplit and split-K), compiled by nvcc for `--arch` with the ptxas report kept; per
config the table's count (`TcConfig.registers_on`), the analytic estimate
(`tc_registers.estimate`) and ptxas's registers and spills; the worst misses printed.

`--write-table` writes `hidetc/schedules/cuda/tc_registers.json`: per arch, ptxas's
counts (unsplit, split-K) and the bytes of spill stores where
there are any, for every candidate of every known GPU
(`tc_common.tc_candidates`, registers aside), the nvcc release that counted them. Run it
after a change to the tensor-core kernels moves the counts (the test in
tests/schedules/test_cuda_tc_registers.py says so).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers.tc_ptxas import reference_counts  # noqa: E402

from hidetc.backends.toolchain.nvcc import nvcc_identity  # noqa: E402
from hidetc.schedules.cuda import tc_registers  # noqa: E402
from hidetc.schedules.cuda.tc_common import tc_candidates, tc_space  # noqa: E402
from hidetc.target import KNOWN_GPUS  # noqa: E402

TABLE_ARCHS = "sm_80,sm_86,sm_89,sm_90"


def nvcc_release() -> str:
    found = re.search(r"release (\d+\.\d+)", nvcc_identity())
    return found.group(1) if found else "unknown"


def dump(table: dict) -> str:
    """JSON with one line per config (a kernel change reads as a diff of the lines it
    moved)."""
    def per_arch(block: dict) -> str:
        return "{\n" + ",\n".join(
            f"  {json.dumps(arch)}: {{" + ",".join(
                f"\n   {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(rows.items()))
            + "}" for arch, rows in sorted(block.items())) + "}"
    head = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in table.items()
            if k not in ("archs", "spills")]
    return ("{" + ",\n ".join(head + [f'"archs": {per_arch(table["archs"])}',
                                      f'"spills": {per_arch(table["spills"])}']) + "}\n")


def write_table(archs: list[str]) -> None:
    configs = sorted({c for gpu in KNOWN_GPUS.values() for c in tc_candidates(gpu)},
                     key=lambda c: c.key)
    table = {"about": "ptxas registers per thread of the tensor-core MatMul kernel at "
                      "the reference task, [unsplit, split-K]: "
                      "hidetc/schedules/cuda/tc_registers.py",
             "nvcc": nvcc_release(),
             "reference": {"m_n_k_dtype": list(tc_registers.REFERENCE),
                           "splits": tc_registers.REFERENCE_SPLITS},
             "archs": {}, "spills": {}}
    for arch in archs:
        plain = reference_counts(configs, arch)
        split = reference_counts(configs, arch, split=True)
        named = [(tc_registers.key_text(c.key), p, s) for c, p, s in zip(configs, plain, split)]
        table["archs"][arch] = {k: [p["registers"], s["registers"]] for k, p, s in named}
        table["spills"][arch] = {k: [p["spills"], s["spills"]] for k, p, s in named
                                 if p["spills"] or s["spills"]}
        print(f"{arch}: {len(configs)} configs; spilling: "
              f"{sorted(table['spills'][arch]) or 'none'}")
    tc_registers.TABLE.write_text(dump(table))
    print(f"wrote {tc_registers.TABLE.relative_to(ROOT)}")


def compare(arch: str, gpu: str, json_path: str | None) -> None:
    configs = tc_space(KNOWN_GPUS[gpu])
    rows = []
    for split in (False, True):
        counted = reference_counts(configs, arch, split=split)
        for c, facts in zip(configs, counted):
            rows.append({"config": tc_registers.key_text(c.key), "split": split,
                         "table": tc_registers.registers(c.key, split, arch),
                         "estimate": tc_registers.estimate(c.key),
                         "registers": facts["registers"], "spills": facts["spills"]})
    for what in ("table", "estimate"):
        misses = [r[what] - r["registers"] for r in rows]
        within = sum(abs(d) <= tc_registers.TOLERANCE for d in misses)
        print(f"{what}: {len(rows)} kernels; miss {min(misses):+d}..{max(misses):+d}; "
              f"within {tc_registers.TOLERANCE}: {within}")
    print(f"most registers {max(r['registers'] for r in rows)}; "
          f"spilling {sum(bool(r['spills']) for r in rows)}")
    if json_path:
        Path(json_path).write_text(json.dumps({"arch": arch, "gpu": gpu, "rows": rows},
                                              indent=1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--json")
    parser.add_argument("--write-table", action="store_true")
    parser.add_argument("--archs", default=TABLE_ARCHS)
    args = parser.parse_args(argv)
    if args.write_table:
        write_table(args.archs.split(","))
    else:
        compare(args.arch, args.gpu, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
