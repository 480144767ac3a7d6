"""Kernel launches and bytes moved per inference, with and without fusion, for the five
benchmark models (planning only: nothing is compiled or run, so it takes seconds).

    python bench/fusion_stats.py [--models resnet50,bert_base] [--target cpu|cuda]
                                 [--json FILE]

Bytes moved is the traffic the plan implies: for every launch, the bytes of each
buffer it reads (inputs, weights) plus the bytes it writes, each counted once per
launch (what a kernel that streams its operands once would move; caches make the real
figure lower for re-read operands, templates' re-reads make it higher). The arena is
the static memory plan's size for the intermediates.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import models
from hidetc.driver.context import plan_graph
from hidetc.driver.launch import ExecutionPlan
from hidetc.frontend.onnx.importer import import_model
from hidetc.graph.pipeline import optimize
from hidetc.target import default_target


def traffic(plan: ExecutionPlan) -> int:
    types = plan.graph.types
    return sum(types[v].nbytes for record in plan.launches for v in record.values)


def stats(name: str, target: str) -> dict:
    graph = optimize(import_model(models.build(name)))
    row = {"model": name, "target": target, "nodes": len(graph.nodes)}
    for label, fuse in (("unfused", False), ("fused", True)):
        plan = plan_graph(graph, default_target(target), fuse=fuse)
        row[label] = {"launches": len(plan.launches), "distinct_kernels": len(plan.functions),
                      "bytes_moved": traffic(plan), "arena_bytes": plan.memory.arena_bytes,
                      "fallbacks": plan.fusion_fallbacks}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(sorted(models.REGISTRY)))
    parser.add_argument("--target", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = [stats(name, args.target) for name in args.models.split(",")]
    print(f"{'model':<14}{'nodes':>6}{'launches':>18}{'MB moved':>20}{'arena MB':>18}")
    for r in rows:
        u, f = r["unfused"], r["fused"]
        print(f"{r['model']:<14}{r['nodes']:>6}{u['launches']:>9} -> {f['launches']:<6}"
              f"{u['bytes_moved'] / 1e6:>10.1f} -> {f['bytes_moved'] / 1e6:<8.1f}"
              f"{u['arena_bytes'] / 1e6:>8.1f} -> {f['arena_bytes'] / 1e6:<8.1f}"
              + (f"  fallbacks: {len(f['fallbacks'])}" if f["fallbacks"] else ""))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
