"""One benchmark model in one precision on the GPU: the GPU check's model step (its own
process, so a sticky GPU fault costs this row only).

    python bench/gpu_model.py OUT.json --model NAME --precision f16|bf16|f32
                              [--device gpu|emulator|none] [--tiny] [--repeat 100]
                              [--seconds S] [--work DIR] [--compile-args "..."] [--top 20]

1. Builds the ONNX model (batch 1, random weights; GPT-2 without the LM head, as
   transformers' GPT2Model, so the peers run the same network) and compiles it with
   `hidetc compile --target cuda --precision P --no-verify` plus --compile-args (default
   --no-tune: the templates' default configs; "--tune --space 2" measures the tuner).
   --no-verify because this step records the error even when it is over the tolerance,
   so a failing artifact is still timed.
2. With a device: runs it on the seeded sample and compares with ONNX Runtime (norm-wise
   relative error per output, bound 1e-2 for f16, 2e-2 for bf16 and 1e-4 for f32);
   `repeat` graph
   replays (>= 100 on a GPU) timed with CUDA events after warm-up (median and min),
   run() wall time, whether the CUDA graph was used (and why not), and the per-launch
   profile (CUDA events around each launch of an un-captured pass), of which OUT.json
   keeps the `top` most expensive launches with grid, block, template and config, and
   for every launch its measured and the cost model's estimated microseconds
   (`profile.calibration`: what the first GPU session fits the model's constants to);
   and the artifact through its C runtime (`OUT/bin/hidetc-run --repeat`, `c_runtime`:
   its median latency and whether its outputs equal the Python runtime's bit for bit;
   on the fake driver without a GPU).
   `--device emulator` (the dry run) runs the same on the emulator: the times are the
   CPU's emulation times, only the code paths are exercised. `--device none` compiles
   only and says so.

OUT.json is rewritten after every stage (compile, check, timing, profile), so a step
killed at its cap keeps what it measured. Exit status 0 unless the script itself broke.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402
from hidetc.backends.runtime.artifact import read_manifest  # noqa: E402
from hidetc.backends.runtime.cuda import CudaExecutor  # noqa: E402
from hidetc.backends.runtime.emulated import EmulatedCudaExecutor  # noqa: E402
from hidetc.driver.api import profile_rows  # noqa: E402
from hidetc.driver.verify import compare, run_onnxruntime  # noqa: E402

BUILD_OPTIONS = {"gpt2": {"lm_head": False}}
TOLERANCE = {"f16": 1e-2, "bf16": 2e-2, "f32": 1e-4}
WARMUP = 10


def _tail(text: str, lines: int = 4) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def compile_artifact(onnx_path: Path, out: Path, precision: str, extra: list[str],
                     limit: float) -> dict:
    cmd = [sys.executable, "-m", "hidetc.tools.cli", "compile", str(onnx_path), "-o", str(out),
           "--target", "cuda", "--precision", precision, "--no-verify", *extra]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(limit, 1),
                              cwd=ROOT)
        rc, text = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = None, f"timed out after {limit:.0f}s\n{exc.stdout or ''}"
    result = {"ok": rc == 0, "rc": rc, "seconds": round(time.perf_counter() - start, 1),
              "flags": extra, "output": _tail(text if isinstance(text, str) else "")}
    if rc == 0:
        tuning = read_manifest(out, verify_checksums=False).get("tuning") or {}
        result["tuning"] = {k: tuning.get(k) for k in ("enabled", "space", "tuned",
                                                       "candidates", "seconds", "failures")}
    return result


def executor_for(device: str, out: Path, manifest: dict, locate_s: float):
    if device == "emulator":
        return EmulatedCudaExecutor(out, manifest)
    return CudaExecutor(out, manifest, locate_timeout_s=locate_s)


def _fake_driver(work: Path) -> Path:
    """The tests' fake libcuda (no GPU: the plan's launches run as no-ops)."""
    lib = work / "fake_libcuda.so"
    subprocess.run(["gcc", "-std=c11", "-O1", "-fPIC", "-shared", "-pthread",
                    str(ROOT / "tests" / "helpers" / "fake_libcuda.c"), "-o", str(lib)],
                   check=True)
    return lib


def c_runner(device: str, out: Path, inputs: dict, python_outputs: dict, repeat: int) -> dict:
    """The artifact through its C runtime, as a service without Python runs it
    (`OUT/bin/hidetc-run`): the median latency of `hidetc_context_run` (host inputs and
    outputs, copies included) and whether its outputs equal the Python runtime's bit for
    bit. Without a GPU it runs on the tests' fake driver: the plan executes (modules,
    launches, graph capture), the values are not computed."""
    work = out.parent / f"{out.name}.c_runtime"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if device != "gpu":
        env["HIDETC_CUDA_DRIVER"] = str(_fake_driver(work))
    cmd = [str(out / "bin" / "hidetc-run"), str(out), "--repeat", str(repeat),
           "--output-dir", str(work / "outputs")]
    for k, (name, array) in enumerate(inputs.items()):
        np.save(work / f"in{k}.npy", array)
        cmd += ["--input", f"{name}={work / f'in{k}.npy'}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    row: dict = {"rc": proc.returncode, "driver": "libcuda" if device == "gpu" else "fake"}
    if proc.returncode:
        row["error"] = _tail(proc.stderr, 2)
        return row
    fields = dict(p.split("=", 1) for p in proc.stdout.split() if "=" in p)
    row["median_ms"] = float(fields.get("median_ms", "nan"))
    if device == "gpu":
        got = {name: np.load(work / "outputs" / f"{name}.npy").view(np.asarray(v).dtype)
               for name, v in python_outputs.items()}    # (bfloat16 comes back as V2)
        row["identical"] = all(got[k].tobytes() == np.asarray(v).tobytes()
                               for k, v in python_outputs.items())
        row["max_abs_diff"] = max(float(np.max(np.abs(got[k].astype(np.float64) -
                                                      np.asarray(v).astype(np.float64))))
                                  if np.asarray(v).size else 0.0
                                  for k, v in python_outputs.items())
    return row


def measure(record: dict, save, device: str, out: Path, inputs: dict, reference: dict,
            precision: str, repeat: int, top: int, deadline: float) -> None:
    manifest = read_manifest(out)
    record["launches"] = len(manifest["cuda"]["launches"])
    executor = executor_for(device, out, manifest, max(deadline - time.time() - 5, 5))
    try:
        record["graph"] = executor.uses_graph
        record["graph_unavailable"] = executor.graph_unavailable
        python_outputs = executor.run(inputs)
        check = compare(python_outputs, reference, rtol=TOLERANCE[precision])
        errors = [o.get("rel_error") for o in check["outputs"].values()]
        record["check"] = {"status": check["status"], "rtol": TOLERANCE[precision],
                           "rel_error": max((e for e in errors if e is not None), default=None),
                           "outputs": check["outputs"]}
        save()
        times = executor.measure(repeat=repeat, warmup=WARMUP if device == "gpu" else 0)
        wall = []
        for _ in range(min(repeat, 50)):
            start = time.perf_counter()
            executor.run(inputs)
            wall.append((time.perf_counter() - start) * 1e3)
        record["timing"] = {"device_ms": float(np.median(times)), "min_ms": float(np.min(times)),
                            "replays": len(times), "run_ms": float(np.median(wall)),
                            "clock": "cuda events" if device == "gpu" else "emulator wall"}
        save()
        record["c_runtime"] = c_runner(device, out, inputs, python_outputs, repeat)
        save()
        rows = profile_rows(manifest, executor.profile(inputs, repeat=20 if device == "gpu"
                                                       else 1))
        total = sum(r["ms"] for r in rows)
        estimated = sum(r.get("estimate_us", 0.0) for r in rows) / 1e3
        record["profile"] = {"launches": len(rows), "total_ms": total,
                             "estimate_ms": estimated,
                             "top": sorted(rows, key=lambda r: -r["ms"])[:top],
                             # every launch, measured beside the cost model's estimate:
                             # [op, template, blocks, waves, measured us, estimated us]
                             "calibration": [[r["op"], r.get("template"), r.get("blocks"),
                                              r.get("waves"), round(r["ms"] * 1e3, 2),
                                              r.get("estimate_us")] for r in rows]}
    finally:
        close = getattr(executor, "close", None)    # the emulator holds no device memory
        if close:
            close()


def run_model(a: argparse.Namespace) -> dict:
    deadline = time.time() + a.seconds
    work = a.work
    work.mkdir(parents=True, exist_ok=True)
    record: dict = {"model": a.model, "precision": a.precision, "tiny": a.tiny,
                    "device": a.device}

    def save():
        a.out.write_text(json.dumps(record, indent=1, default=str))
    proto = models.build(a.model, tiny=a.tiny, **BUILD_OPTIONS.get(a.model, {}))
    tag = f"{a.model}{'-tiny' if a.tiny else ''}"
    onnx_path = work / f"{tag}.onnx"
    models.save(proto, onnx_path)
    out = work / f"{tag}.{a.precision}{'.' + a.tag if a.tag else ''}.out"
    extra = shlex.split(a.compile_args)
    record["compile"] = compile_artifact(onnx_path, out, a.precision, extra,
                                         deadline - time.time() - 10)
    save()
    if not record["compile"]["ok"]:
        record["status"] = "error"
        last = record["compile"]["output"].splitlines()[-1:]
        record["error"] = "compile failed" + (f": {last[0]}" if last else "")
        save()
        return record
    if a.device == "none":
        record["status"] = "compiled"
        record["note"] = "compiled only: no GPU to run it on"
        save()
        return record
    inputs = models.sample_inputs(proto, seed=1)
    try:
        reference = run_onnxruntime(onnx_path, inputs)
        measure(record, save, a.device, out, inputs, reference, a.precision, a.repeat, a.top,
                deadline)
        record["status"] = record["check"]["status"]
    except Exception as exc:        # a HidetcError (a located fault) or any crash: the row
        record["status"] = "error"
        record["error"] = f"{type(exc).__name__}: {exc}"[:600]
    save()
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--model", required=True, choices=sorted(models.REGISTRY))
    p.add_argument("--precision", required=True, choices=sorted(TOLERANCE))
    p.add_argument("--device", choices=["gpu", "emulator", "none"], default="gpu")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--work", type=Path,
                   default=Path(os.environ.get("HIDETC_GPU_WORK", "/tmp/hidetc-gpu-check")))
    p.add_argument("--compile-args", default="--no-tune")
    p.add_argument("--tag", default="", help="a suffix of the artifact's folder name")
    p.add_argument("--top", type=int, default=20)
    a = p.parse_args(argv)
    record = run_model(a)
    status = record.get("status")
    print(f"{a.model} {a.precision}: {status}" +
          (f", {record['timing']['device_ms']:.3f} ms" if "timing" in record else "") +
          (f" ({record['error']})" if record.get("error") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
