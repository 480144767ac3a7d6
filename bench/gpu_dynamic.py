"""BERT over a range of sequence lengths on the GPU: the GPU check's dynamic-shapes step
(issue 36: "the GPU run measures BERT at three lengths").

    python bench/gpu_dynamic.py OUT.json [--precision f16] [--device gpu|emulator|none]
                                [--tiny] [--lengths 16,128,384] [--range 1..512]
                                [--repeat 100] [--seconds S] [--work DIR]

Builds BERT with a symbolic sequence (`models.bert.build_bert_base(dynamic=True)`),
compiles it once for the range (`--dim seq=LO..HI`, cuda, --no-tune --no-verify) and
once per length as a static artifact, then per length: both artifacts' outputs against
ONNX Runtime (CPU, f32 model; the precision's bound), and their device time per pass
(CUDA-event replays of the length's captured graph, median of `repeat`, the two
interleaved in rounds of `repeat // 5`), the ratio dynamic/static, and which dispatch
variant served it. `--device emulator` (the dry run: tiny BERT, lengths inside its
1..32) exercises the same path on the emulator; the times are then the CPU's. OUT.json
is rewritten after every stage, so a step killed at its cap keeps what it measured.
Exit status 0 unless the script itself broke.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from gpu_model import TOLERANCE, compile_artifact, executor_for  # noqa: E402

import models  # noqa: E402
from hidetc.backends.runtime.artifact import read_manifest  # noqa: E402
from hidetc.driver.verify import compare, run_onnxruntime  # noqa: E402


def _feeds(length: int) -> dict:
    rng = np.random.default_rng(length)
    return {"input_ids": rng.integers(0, 100, (1, length)).astype(np.int64),
            "attention_mask": np.ones((1, length), np.int64)}


def _check(executor, feeds: dict, reference: dict, precision: str) -> dict:
    report = compare(executor.run(feeds), reference, rtol=TOLERANCE[precision])
    errors = [o.get("rel_error") for o in report["outputs"].values()]
    return {"status": report["status"],
            "rel_error": max((e for e in errors if e is not None), default=None)}


def _times(executor, feeds: dict, repeat: int) -> list[float]:
    executor.run(feeds)                 # this length's shape current (captured on a GPU)
    return executor.measure(repeat=repeat, warmup=min(repeat, 10))


def run(a: argparse.Namespace) -> dict:
    deadline = time.time() + a.seconds
    a.work.mkdir(parents=True, exist_ok=True)
    record: dict = {"model": "bert_base" + ("_tiny" if a.tiny else ""), "range": a.range,
                    "precision": a.precision, "device": a.device, "lengths": []}

    def save():
        a.out.write_text(json.dumps(record, indent=1, default=str))
    onnx_path = a.work / f"bert{'-tiny' if a.tiny else ''}-dynamic.onnx"
    models.save(models.bert.build_bert_base(tiny=a.tiny, dynamic=True), onnx_path)
    dynamic = a.work / f"{onnx_path.stem}.{a.precision}.out"
    record["compile"] = compile_artifact(onnx_path, dynamic, a.precision,
                                         ["--no-tune", "--dim", f"seq={a.range}"],
                                         deadline - time.time() - 10)
    save()
    if not record["compile"]["ok"] or a.device == "none":
        record["status"] = "error" if not record["compile"]["ok"] else "compiled"
        save()
        return record
    manifest = read_manifest(dynamic)
    record["variants"] = len(manifest["dynamic"]["variants"])
    dyn = executor_for(a.device, dynamic, manifest, 60)
    try:
        for length in (int(x) for x in a.lengths.split(",")):
            if time.time() > deadline - 20:
                record["note"] = "out of time"
                break
            row: dict = {"seq": length}
            record["lengths"].append(row)
            static = a.work / f"{onnx_path.stem}.{a.precision}.seq{length}.out"
            row["static_compile"] = compile_artifact(
                onnx_path, static, a.precision, ["--no-tune", "--dim", f"seq={length}"],
                deadline - time.time() - 10)
            feeds = _feeds(length)
            reference = run_onnxruntime(onnx_path, feeds)
            row["dynamic_check"] = _check(dyn, feeds, reference, a.precision)
            row["variant"] = dyn.pass_of(feeds).variant
            save()
            if not row["static_compile"]["ok"]:
                continue
            st = executor_for(a.device, static, read_manifest(static), 60)
            try:
                row["static_check"] = _check(st, feeds, reference, a.precision)
                rounds, per = 5, max(a.repeat // 5, 1)
                d_times, s_times = [], []
                for _ in range(rounds):
                    d_times += _times(dyn, feeds, per)
                    s_times += _times(st, feeds, per)
                row["dynamic_ms"] = float(np.median(d_times))
                row["static_ms"] = float(np.median(s_times))
                row["dynamic_over_static"] = row["dynamic_ms"] / row["static_ms"]
                row["clock"] = "cuda events" if a.device == "gpu" else "emulator wall"
            finally:
                close = getattr(st, "close", None)
                if close:
                    close()
            save()
    finally:
        close = getattr(dyn, "close", None)
        if close:
            close()
    checks = [r.get(k, {}).get("status") for r in record["lengths"]
              for k in ("dynamic_check", "static_check")]
    record["status"] = "passed" if checks and all(c == "passed" for c in checks) else "failed"
    save()
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--precision", choices=sorted(TOLERANCE), default="f16")
    p.add_argument("--device", choices=["gpu", "emulator", "none"], default="gpu")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--lengths", default="16,128,384")
    p.add_argument("--range", default="1..512")
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--work", type=Path,
                   default=Path(os.environ.get("HIDETC_GPU_WORK", "/tmp/hidetc-gpu-check")))
    a = p.parse_args(argv)
    record = run(a)
    for row in record["lengths"]:
        ratio = row.get("dynamic_over_static")
        print(f"seq {row['seq']}: dynamic {row.get('dynamic_check', {}).get('status')}, "
              f"static {row.get('static_check', {}).get('status')}"
              + (f", dynamic/static {ratio:.3f}" if ratio else ""))
    print(f"bert dynamic {a.precision}: {record.get('status')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
