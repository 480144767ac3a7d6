"""Time the five benchmark models on the CPU: hidetc beside ONNX Runtime, same inputs,
same process, median of repeated runs after warm-up; prints a table and writes JSON.

    python bench/models_cpu.py [--models resnet50,bert_base] [--repeat 20] [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import onnxruntime as ort

import hidetc
import models
from hidetc.driver.verify import compare, time_call


def bench_model(name: str, work: Path, repeat: int) -> dict:
    proto = models.build(name)
    path = work / f"{name}.onnx"
    models.save(proto, path)
    start = time.perf_counter()
    result = hidetc.compile_model(path, work / f"{name}.out", target="cpu")
    compile_s = time.perf_counter() - start
    model = hidetc.load(work / f"{name}.out")
    inputs = models.sample_inputs(proto, seed=1)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    ours = time_call(lambda: model.run(inputs), repeat=repeat)
    theirs = time_call(lambda: session.run(None, inputs), repeat=repeat)
    reference = dict(zip([o.name for o in session.get_outputs()], session.run(None, inputs)))
    errors = compare(model.run(inputs), reference, rtol=1e-4)
    return {"model": name, "hidetc_ms": ours["median_ms"], "onnxruntime_ms": theirs["median_ms"],
            "ratio": ours["median_ms"] / theirs["median_ms"], "compile_s": compile_s,
            "kernels": len(result.manifest["kernels"]), "check": errors["status"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(sorted(models.REGISTRY)))
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--work", default="/tmp/hidetc-bench")
    parser.add_argument("--out", default=None, help="write results JSON into this folder")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'model':<14}{'hidetc ms':>11}{'ORT ms':>9}{'ratio':>8}{'compile s':>11}  check")
    for name in args.models.split(","):
        row = bench_model(name, work, args.repeat)
        rows.append(row)
        print(f"{name:<14}{row['hidetc_ms']:>11.2f}{row['onnxruntime_ms']:>9.2f}"
              f"{row['ratio']:>7.2f}x{row['compile_s']:>11.1f}  {row['check']}", flush=True)
    if args.out:
        stamp = time.strftime("%Y-%m-%d")
        doc = {"date": stamp, "machine": platform.processor() or platform.machine(),
               "cores": os.cpu_count(), "onnxruntime": ort.__version__,
               "hidetc": hidetc.__version__, "repeat": args.repeat, "results": rows}
        out = Path(args.out) / f"{stamp}-cpu-models.json"
        out.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
