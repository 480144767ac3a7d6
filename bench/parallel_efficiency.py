"""Static parallel efficiency of the cpu plans at other core counts (no machine needed:
the plans are made for a CpuTarget of N cores, nothing is built or run).

    python bench/parallel_efficiency.py [--models resnet50,bert_base] [--cores 1,2,16,64]
                                        [--isa avx2|avx512] [--json OUT.json]

Per launch with a parallel loop of T tasks on C cores, the static efficiency is
T / (ceil(T / C) x C): the share of the cores' time slots the tasks fill when each task
costs the same. A model's figure weights each launch by its FLOPs (`task_flops`: the
anchor's), so the GEMMs and convolutions dominate as they do in time. Issue 24's
targets: at least 0.85 at 16 cores and 0.6 at 64 for ResNet-50 and BERT-base, batch 1.
The default configs are planned (what a cross-compile without records gets), for
`--isa` (default: this process's, `cpu_isa.current()`).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from hidetc import cpu_isa  # noqa: E402
from hidetc.driver.context import CompileContext, plan_graph  # noqa: E402
from hidetc.frontend.onnx.importer import load_model  # noqa: E402
from hidetc.target import CpuTarget  # noqa: E402


def efficiency(tasks: int, cores: int) -> float:
    return tasks / (math.ceil(tasks / cores) * cores)


def plan_efficiency(graph, target: CpuTarget) -> dict:
    """FLOP-weighted static efficiency of `graph`'s plan for `target`, and the launches
    that lose the most (FLOPs x (1 - efficiency))."""
    plan = plan_graph(graph, target)
    rows = []
    for record in plan.launches:
        facts = record.facts
        tasks = facts.get("parallel_tasks") or 1
        rows.append({"node": record.node, "op": record.op, "flops": facts["flops"],
                     "tasks": tasks, "efficiency": efficiency(tasks, target.cores)})
    total = sum(r["flops"] for r in rows) or 1
    weighted = sum(r["flops"] * r["efficiency"] for r in rows) / total
    losers = sorted(rows, key=lambda r: -r["flops"] * (1 - r["efficiency"]))[:5]
    return {"cores": target.cores, "efficiency": weighted, "launches": len(rows),
            "gflops": total / 1e9, "losers": losers}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet50,bert_base")
    p.add_argument("--cores", default="1,2,16,64")
    p.add_argument("--isa", choices=sorted(cpu_isa.ISAS), default=None)
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    isa = a.isa or cpu_isa.current().name
    doc = {"isa": isa, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in filter(None, a.models.split(",")):
            path = Path(tmp) / f"{name}.onnx"
            models.save(models.build(name), path)
            graph = CompileContext.for_machine(CpuTarget(isa=isa, cores=1)).optimize(
                load_model(path))
            doc["models"][name] = []
            for cores in (int(c) for c in a.cores.split(",")):
                row = plan_efficiency(graph, CpuTarget(isa=isa, cores=cores))
                doc["models"][name].append(row)
                worst = ", ".join(f"{r['op']} {r['tasks']} tasks ({r['efficiency']:.2f})"
                                  for r in row["losers"][:3])
                print(f"{name:<12} {cores:>3} cores: {row['efficiency']:.3f} "
                      f"({row['launches']} launches, {row['gflops']:.2f} GFLOP); "
                      f"losing most: {worst}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
