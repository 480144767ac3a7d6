"""ptxas's register counts for the tensor-core space, and the table the space is pruned by.

    python bench/tc_registers.py [--arch sm_90] [--gpu h100-sxm] [--family half|int8]
                                 [--json FILE]
    python bench/tc_registers.py --write-table [--archs sm_80,sm_86,sm_89,sm_90]

The first form: every config of a tensor-core space (the half family: `tc_common.
tc_space`; int8: `matmul_int8_tc.int8_space`, for the GPU's limits) built for its
family's reference task of `schedules/cuda/tc_registers.py` (half: unsplit and
split-K), compiled by nvcc for `--arch` with the ptxas report kept; per config the
table's count, the formula's estimate and ptxas's registers and spills; the worst
misses printed.

`--write-table` writes `hidetc/schedules/cuda/tc_registers.json`: per family and arch,
ptxas's counts (half: unsplit and split-K) and the bytes of spill stores where there
are any, for every candidate of every known GPU (`tc_common.tc_candidates`,
`matmul_int8_tc.int8_candidates`: registers aside), the nvcc release that counted them. Run it
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
from hidetc.schedules.cuda.matmul_int8_tc import int8_candidates, int8_space  # noqa: E402
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
            f"    {json.dumps(arch)}: {{" + ",".join(
                f"\n     {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(rows.items()))
            + "}" for arch, rows in sorted(block.items())) + "}"

    def family(block: dict) -> str:
        return ("{\n   " + ",\n   ".join(
            [f'"reference": {json.dumps(block["reference"])}',
             f'"archs": {per_arch(block["archs"])}',
             f'"spills": {per_arch(block["spills"])}']) + "}")
    head = [f"{json.dumps(k)}: {json.dumps(v)}" for k, v in table.items() if k != "families"]
    families = ",\n  ".join(f"{json.dumps(name)}: {family(block)}"
                             for name, block in table["families"].items())
    return "{" + ",\n ".join(head + ['"families": {\n  ' + families + "}"]) + "}\n"


def candidates(family: str) -> list:
    """Every known GPU's register-free candidates of the family's template."""
    of = tc_candidates if family == "half" else int8_candidates
    return sorted({c for gpu in KNOWN_GPUS.values() for c in of(gpu)}, key=lambda c: c.key)


def family_table(family: str, archs: list[str]) -> dict:
    spec = tc_registers.FAMILIES[family]
    configs, split = candidates(family), spec["split"]
    block = {"reference": {**{k: v for k, v in spec.items() if k != "split"},
                           "splits": tc_registers.REFERENCE_SPLITS if split else 1},
             "archs": {}, "spills": {}}
    for arch in archs:
        columns = [reference_counts(configs, arch, family=family)]
        if split:
            columns.append(reference_counts(configs, arch, split=True, family=family))
        rows, spilled = {}, {}
        for c, *facts in zip(configs, *columns):
            key = tc_registers.key_text(c.key)
            rows[key] = [f["registers"] for f in facts]
            if any(f["spills"] for f in facts):
                spilled[key] = [f["spills"] for f in facts]
        block["archs"][arch], block["spills"][arch] = rows, spilled
        print(f"{family} {arch}: {len(configs)} configs; spilling: "
              f"{sorted(spilled) or 'none'}", flush=True)
    return block


def write_table(archs: list[str], families: list[str]) -> None:
    table = {"about": "ptxas registers per thread of the tensor-core MatMul kernels at "
                      "their reference tasks, [unsplit, split-K] per config: "
                      "hidetc/schedules/cuda/tc_registers.py",
             "nvcc": nvcc_release(),
             "families": {family: family_table(family, archs) for family in families}}
    tc_registers.TABLE.write_text(dump(table))
    print(f"wrote {tc_registers.TABLE.relative_to(ROOT)}")


def compare(arch: str, gpu: str, family: str, json_path: str | None) -> None:
    configs = (tc_space if family == "half" else int8_space)(KNOWN_GPUS[gpu])
    rows = []
    for split in (False, True)[:1 + tc_registers.FAMILIES[family]["split"]]:
        counted = reference_counts(configs, arch, split=split, family=family)
        for c, facts in zip(configs, counted):
            rows.append({"config": tc_registers.key_text(c.key), "split": split,
                         "table": tc_registers.count(family, c.key, split, arch),
                         "estimate": (tc_registers.estimate(c.key) if family == "half"
                                      else c.estimated_registers),
                         "registers": facts["registers"], "spills": facts["spills"]})
    for what in ("table", "estimate"):
        misses = [r[what] - r["registers"] for r in rows if r[what] is not None]
        within = sum(abs(d) <= tc_registers.TOLERANCE for d in misses)
        print(f"{what}: {len(misses)} of {len(rows)} kernels; miss {min(misses):+d}.."
              f"{max(misses):+d}; within {tc_registers.TOLERANCE}: {within}")
    print(f"most registers {max(r['registers'] for r in rows)}; "
          f"spilling {sum(bool(r['spills']) for r in rows)}")
    if json_path:
        Path(json_path).write_text(json.dumps({"arch": arch, "gpu": gpu, "family": family,
                                               "rows": rows}, indent=1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--gpu", default="h100-sxm")
    parser.add_argument("--json")
    parser.add_argument("--family", default="half", choices=sorted(tc_registers.FAMILIES))
    parser.add_argument("--write-table", action="store_true")
    parser.add_argument("--archs", default=TABLE_ARCHS)
    args = parser.parse_args(argv)
    if args.write_table:
        write_table(args.archs.split(","), sorted(tc_registers.FAMILIES))
    else:
        compare(args.arch, args.gpu, args.family, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
