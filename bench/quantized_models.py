"""Quantized models on the CPU: hidetc beside ONNX Runtime on the same int8 model, and
both on the f32 model it was quantized from.

    python bench/quantized_models.py [--models resnet50_qdq,bert_base_dyn] [--tiny]
        [--work DIR] [--space N] [--repeat 20] [--rounds 5] [--out RESULT.json]

Models (`--models`, default all): `resnet50_qdq`, `mobilenet_v2_qdq`, `bert_base_qdq`
quantized by ONNX Runtime's `quantize_static` (QDQ format, per channel, calibrated on one
sample -- the builder's inputs at seed 0 --, ORT's defaults otherwise: int8 activations
and weights, MinMax calibration); `bert_base_dyn`, `gpt2_dyn` by `quantize_dynamic`
(int8 weights). The f32 model is `models.build(name)` (CNNs with `fold_bn=True`;
`--tiny` for the tiny variants). Under `--work` (reused between runs: a model file is
built once, an artifact recompiled only when its model file or `--space` changed) each
model is quantized, then the quantized and the f32 model compiled by `hidetc compile
--target cpu` with default options (`--space` passed through; tuning records reused as
a compile reuses them).

Timing: the same seeded inputs (the builder's at seed 1) for the four runners --
hidetc on the int8 model, ONNX Runtime on it (CPUExecutionProvider, ORT_ENABLE_ALL,
intra_op_num_threads = the cores this process may use), hidetc f32, ONNX Runtime f32
-- interleaved round by round after a warm-up (`hidetc.tools.bench.alternate`: an idle
pause before each runner's block so the other runtime's spinning threads sleep);
`--repeat` calls per runner over `--rounds` rounds, medians reported, and the ratios
hidetc_int8 / ort_int8 and hidetc_int8 / hidetc_f32 (of the medians, and `_paired`:
the median over rounds of the ratio of each round's fastest calls). Errors: each
engine's norm-wise relative error ||y - ref|| / ||ref|| against ONNX Runtime on the
int8 model (the largest over the outputs: `hidetc.tools.bench.norm_error`), and hidetc
f32 against ONNX Runtime f32. The JSON (printed, and written to `--out`) also holds the
machine (CPU model, its int8/bf16 flags, cores), each compile's verification verdict
and the int8 feature its kernels use.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnxruntime as ort  # noqa: E402
from onnxruntime.quantization import (  # noqa: E402
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

import hidetc  # noqa: E402
import models  # noqa: E402
from bench import cpu_peak  # noqa: E402
from hidetc.backends.runtime.artifact import read_manifest  # noqa: E402
from hidetc.target import usable_cores  # noqa: E402
from hidetc.tools.bench import alternate, norm_error, paired_ratio  # noqa: E402

# benchmark name -> (models.REGISTRY name, quantization)
SPECS = {
    "resnet50_qdq": ("resnet50", "static"),
    "mobilenet_v2_qdq": ("mobilenet_v2", "static"),
    "bert_base_qdq": ("bert_base", "static"),
    "bert_base_dyn": ("bert_base", "dynamic"),
    "gpt2_dyn": ("gpt2", "dynamic"),
}
CNNS = ("resnet50", "mobilenet_v2", "inception_v3")
FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_tile", "amx_int8", "avx512_bf16",
         "amx_bf16")
INTEGER_OPS = ("MatMulInteger", "ConvInteger", "ConvIntegerNHWC")
RUNNERS = ("hidetc_int8", "ort_int8", "hidetc_f32", "ort_f32")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def machine() -> dict:
    """The CPU's model name, the flags relevant to int8 / bf16 kernels, and cores."""
    name, flags = None, set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "model name" and name is None:
                name = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return {"cpu": name or platform.processor() or platform.machine(),
            "flags": {f: f in flags for f in FLAGS},
            "cores": os.cpu_count(), "usable_cores": usable_cores(),
            "platform": platform.platform()}


class _Reader(CalibrationDataReader):
    def __init__(self, samples):
        self._samples = iter(samples)

    def get_next(self):
        return next(self._samples, None)


def prepare(key: str, tiny: bool, work: Path):
    """(the f32 proto, its path, the quantized model's path) of benchmark `key`, each
    file written under `work` unless it is there already."""
    name, mode = SPECS[key]
    suffix = "-tiny" if tiny else ""
    src = work / f"{name}{suffix}.onnx"
    if src.is_file():
        import onnx
        proto = onnx.load(str(src))
    else:
        log(f"{key}: building {name}{suffix}")
        proto = models.build(name, tiny=tiny, **({"fold_bn": True} if name in CNNS else {}))
        models.save(proto, src)
    dst = work / f"{key}{suffix}.onnx"
    if not dst.is_file():
        log(f"{key}: quantizing ({mode})")
        tmp = dst.with_suffix(".tmp.onnx")
        if mode == "static":
            quantize_static(src, tmp, _Reader([models.sample_inputs(proto, seed=0)]),
                            quant_format=QuantFormat.QDQ, per_channel=True)
        else:
            quantize_dynamic(src, tmp, weight_type=QuantType.QInt8)
        tmp.rename(dst)
    return proto, src, dst


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def compile_artifact(model: Path, space, tag: str) -> tuple[Path, dict, float | None]:
    """`hidetc compile --target cpu` of `model` next to it (reused when its manifest is of
    this model file and `space`): (artifact, manifest, compile seconds or None)."""
    out = model.with_name(f"{model.stem}-{tag}.out")
    if (out / "manifest.yaml").is_file():
        manifest = read_manifest(out)
        if (manifest["model"].get("sha256") == _sha256(model)
                and manifest["config"].get("space") == space):
            log(f"{model.stem}: reusing {out}")
            return out, manifest, None
    log(f"{model.stem}: hidetc compile")
    command = [sys.executable, "-m", "hidetc.tools.cli", "compile", str(model), "-o", str(out),
               "--target", "cpu"] + (["--space", str(space)] if space is not None else [])
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["(no output)"]
        raise SystemExit(f"{model.name}: hidetc compile failed: {lines[-1]}")
    return out, read_manifest(out), seconds


def verdict(manifest: dict) -> dict:
    """The compile's verification: status, the worst error vs ONNX Runtime and how the
    outputs beyond their f32 bound passed (`passed_by`), kernels checked one by one."""
    record = manifest.get("verification") or {}
    outputs = record.get("outputs") or {}
    errors = [e["rel_error"] for e in outputs.values() if "rel_error" in e]
    result = {"status": record.get("status"),
              "rel_error": max(errors) if errors else None}
    passed_by = sorted({e["passed_by"] for e in outputs.values() if "passed_by" in e})
    if passed_by:
        result["passed_by"] = passed_by
        result["exact"] = {k: e["exact"] for k, e in outputs.items() if "exact" in e}
    if isinstance(record.get("kernels"), dict):
        result["kernels_checked"] = record["kernels"].get("checked")
    return result


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def bench_model(key: str, args, threads: int) -> dict:
    proto, src, dst = prepare(key, args.tiny, args.work)
    tag = "default" if args.space is None else f"space{args.space}"
    q_out, q_manifest, q_compile = compile_artifact(dst, args.space, tag)
    f_out, f_manifest, f_compile = compile_artifact(src, args.space, tag)
    inputs = models.sample_inputs(proto, seed=1)
    q_model, f_model = hidetc.load(q_out), hidetc.load(f_out)
    q_session, f_session = session(dst, threads), session(src, threads)
    names = [o.name for o in q_session.get_outputs()]

    def ort_run(s):
        return dict(zip(names, s.run(None, inputs)))
    outputs = {"hidetc_int8": q_model.run(inputs), "ort_int8": ort_run(q_session),
               "hidetc_f32": f_model.run(inputs), "ort_f32": ort_run(f_session)}
    reference = outputs["ort_int8"]
    launches = Counter(k["op"] for k in q_manifest["kernels"])
    row = {"model": key, "base": SPECS[key][0], "quantization": SPECS[key][1],
           "tiny": args.tiny,
           "compile_s": {"int8": q_compile, "f32": f_compile},
           "verification": {"int8": verdict(q_manifest), "f32": verdict(f_manifest)},
           "cpu_features": q_manifest.get("cpu_features"),
           "kernels": {"int8": len(q_manifest["kernels"]), "f32": len(f_manifest["kernels"])},
           "integer_launches": {op: launches[op] for op in INTEGER_OPS if launches[op]},
           "int8_templates": sorted({k["template"] for k in q_manifest["kernels"]
                                     if k["op"] in INTEGER_OPS}),
           "weights_mb": {"int8": (q_out / "weights.bin").stat().st_size / 2**20,
                          "f32": (f_out / "weights.bin").stat().st_size / 2**20},
           "error_vs_ort_int8": {k: norm_error(v, reference) for k, v in outputs.items()
                                 if k != "ort_int8"},
           "hidetc_f32_error_vs_ort_f32": norm_error(outputs["hidetc_f32"],
                                                     outputs["ort_f32"])}
    log(f"{key}: timing {', '.join(RUNNERS)} ({args.repeat} calls each)")
    runners = {"hidetc_int8": lambda: q_model.run(inputs),
               "ort_int8": lambda: q_session.run(None, inputs),
               "hidetc_f32": lambda: f_model.run(inputs),
               "ort_f32": lambda: f_session.run(None, inputs)}
    timed = alternate(runners, args.repeat, rounds=rounds(args))
    for name in RUNNERS:
        row[f"{name}_ms"] = timed[name]["median_ms"]
        row[f"{name}_min_ms"] = timed[name]["min_ms"]
    best = {k: v["round_best_ms"] for k, v in timed.items()}
    for a, b in (("hidetc_int8", "ort_int8"), ("hidetc_int8", "hidetc_f32"),
                 ("ort_int8", "ort_f32"), ("hidetc_f32", "ort_f32")):
        row[f"ratio_{a}_over_{b}"] = row[f"{a}_ms"] / row[f"{b}_ms"]
        row[f"ratio_{a}_over_{b}_paired"] = paired_ratio(best[a], best[b])
    return row


def rounds(args) -> int:
    """The interleaved rounds: `--rounds`, at most one per timed call."""
    return max(1, min(args.rounds, args.repeat))


def table(rows: list[dict]) -> str:
    head = (f"{'model':<18}{'hidetc i8':>10}{'ORT i8':>9}{'hidetc f32':>11}{'ORT f32':>9}"
            f"{'h/ORT i8':>9}{'h i8/f32':>9}{'err h i8':>10}{'err ORT f32':>12}  verify")
    lines = [head]
    for r in rows:
        errors = r["error_vs_ort_int8"]
        check = r["verification"]["int8"]
        status = (check["status"] or "?") + (" (quantized)" if any(
            "quantized" in p for p in check.get("passed_by", ())) else "")
        lines.append(f"{r['model']:<18}{r['hidetc_int8_ms']:>10.3f}{r['ort_int8_ms']:>9.3f}"
                     f"{r['hidetc_f32_ms']:>11.3f}{r['ort_f32_ms']:>9.3f}"
                     f"{r['ratio_hidetc_int8_over_ort_int8']:>8.2f}x"
                     f"{r['ratio_hidetc_int8_over_hidetc_f32']:>8.2f}x"
                     f"{errors['hidetc_int8']:>10.2e}{errors['ort_f32']:>12.2e}  {status}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(SPECS),
                   help=f"comma-separated, of {', '.join(SPECS)}")
    p.add_argument("--tiny", action="store_true", help="the tiny variants")
    p.add_argument("--work", type=Path, default=Path("/tmp/hidetc-bench-quantized"),
                   help="models and artifacts, reused between runs")
    p.add_argument("--space", type=int, choices=(0, 1, 2), default=None,
                   help="passed to hidetc compile (default: its own)")
    p.add_argument("--repeat", type=int, default=20, help="timed calls per runner")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    p.add_argument("--out", type=Path, default=None, help="write the JSON result here")
    args = p.parse_args(argv)
    keys = [k.strip() for k in args.models.split(",") if k.strip()]
    unknown = [k for k in keys if k not in SPECS]
    if unknown:
        p.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(SPECS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    threads = usable_cores()
    rows = [bench_model(key, args, threads) for key in keys]
    result = {"date": time.strftime("%Y-%m-%d"), "machine": machine(),
              "onnxruntime": ort.__version__, "hidetc": hidetc.__version__,
              "numpy": np.__version__, "ort_intra_op_threads": threads,
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
              "tiny": args.tiny, "space": args.space, "repeat": args.repeat,
              "rounds": rounds(args), "results": rows}
    log(table(rows))
    return cpu_peak.report(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
