"""Static facts of the cuda plans, with no GPU: how well each launch fills the GPU and
what the cost model (`hidetc/schedules/cuda/cost.py`) estimates for the model.

    python bench/cuda_plan_stats.py [--models resnet50,bert_base,gpt2] [--gpu h200]
                                    [--precision f16] [--json OUT.json]

Per model (batch 1, the default configs: what a compile without records plans for that
GPU): the launches, the share of the FLOPs (`task_flops`: the anchors') that run in
launches of at least as many blocks as the GPU has SMs, the launches below that, and
the cost model's sum of per-launch estimates beside the fastest PyTorch peer's measured
median on the H200 (bench/results/2026-11-30-h200-peers.json) as a ratio. Issue 25's
targets, f16 for sm_90: at least 90% of the FLOPs in launches of >= 132 blocks for
ResNet-50, BERT-base and GPT-2; the estimate below 0.8x of the peer for all five. The
estimate is uncalibrated until a GPU session fits the model's constants: it says where
time would go, not what it will be.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from hidetc.driver.context import CompileContext, plan_graph  # noqa: E402
from hidetc.frontend.onnx.importer import load_model  # noqa: E402
from hidetc.target import KNOWN_GPUS, CudaTarget  # noqa: E402

PEERS = ROOT / "bench" / "results" / "2026-11-30-h200-peers.json"
DEFAULT_MODELS = "resnet50,inception_v3,mobilenet_v2,bert_base,gpt2"


def plan_stats(graph, target: CudaTarget) -> dict:
    """The plan's launches with their blocks and estimates, and the model's totals."""
    plan = plan_graph(graph, target)
    rows = []
    for record in plan.launches:
        facts = record.facts
        rows.append({"node": record.node, "op": record.op, "flops": facts["flops"],
                     "blocks": facts["blocks"], "waves": facts["waves"],
                     "estimate_us": facts["estimate_us"],
                     "config": record.choice.get("config")})
    total = sum(r["flops"] for r in rows) or 1
    filled = sum(r["flops"] for r in rows if r["blocks"] >= target.sms)
    short = [r for r in rows if r["blocks"] < target.sms]
    return {"gpu": target.name, "sms": target.sms, "launches": len(rows),
            "gflops": total / 1e9, "filled_flop_share": filled / total,
            "launches_below_sms": len(short),
            "estimate_ms": sum(r["estimate_us"] for r in rows) / 1e3,
            "largest_short": sorted(short, key=lambda r: -r["flops"])[:5],
            "slowest": sorted(rows, key=lambda r: -r["estimate_us"])[:5]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=DEFAULT_MODELS)
    p.add_argument("--gpu", default="h200", choices=sorted(KNOWN_GPUS))
    p.add_argument("--precision", default="f16", choices=("f16", "f32"))
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    target = KNOWN_GPUS[a.gpu]
    peers = json.loads(PEERS.read_text())["median_ms"] if a.gpu == "h200" else {}
    doc = {"gpu": target.name, "precision": a.precision, "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in filter(None, a.models.split(",")):
            path = Path(tmp) / f"{name}.onnx"
            models.save(models.build(name), path)
            graph = CompileContext.for_machine(target, precision=a.precision).optimize(
                load_model(path))
            row = plan_stats(graph, target)
            if name in peers:
                row["peer_ms"] = peers[name]
                row["estimate_vs_peer"] = row["estimate_ms"] / peers[name]
            doc["models"][name] = row
            vs = (f", {row['estimate_vs_peer']:.2f}x the peer's {row['peer_ms']} ms"
                  if "peer_ms" in row else "")
            print(f"{name:<13} {row['launches']:>4} launches, {row['gflops']:.2f} GFLOP: "
                  f"{row['filled_flop_share']:.1%} of FLOPs in launches of >= {target.sms} "
                  f"blocks ({row['launches_below_sms']} launches below); estimate "
                  f"{row['estimate_ms']:.3f} ms{vs}", flush=True)
    if a.json:
        a.json.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
