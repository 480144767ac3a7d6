"""The per-model half of the one-shot GPU check (bench/gpu_check.sh drives it).

    python bench/gpu_check.py env RESULTS_DIR               # GPU, driver, package versions
    python bench/gpu_check.py model NAME RESULTS_DIR --seconds S [--repeat N] [--tiny]
    python bench/gpu_check.py peers NAME [--repeat N]       # child: one JSON line per figure
    python bench/gpu_check.py report RESULTS_DIR            # results.md from results.json

`model` builds the ONNX model (batch 1, random weights; GPT-2 without the LM head, as
transformers' GPT2Model), compiles it with `hidetc compile --target cuda` (a failure is
recorded and the check moves on), runs the artifact with CudaExecutor, compares it with
ONNX Runtime (norm-wise relative error, f32 tolerance 1e-4) and times it (CUDA events
around the graph replay, median of N after warm-up); then times the PyTorch peers in a
child process: eager, eager replayed from a CUDA graph and torch.compile
(mode="reduce-overhead"), f32 and f16, same model definitions (torchvision,
transformers). f32 peers run with TF32 off (hidetc's f32 must meet 1e-4). Every step is
bounded by `--seconds`; results.json and results.md are rewritten after each model, so
a timeout keeps what was measured. torch, torchvision and transformers are optional and
imported (importlib) only in the `peers` child, so the hidetc half never pays for them.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402

try:  # a broken hidetc is recorded per model; the env and the peers are measured anyway
    from hidetc.errors import HidetcError
    from hidetc.runtime.artifact import read_manifest
    from hidetc.runtime.cuda import CudaExecutor
    from hidetc.verify import compare, run_onnxruntime
    HIDETC_IMPORT_ERROR = None
except Exception as exc:
    HidetcError = RuntimeError
    HIDETC_IMPORT_ERROR = f"hidetc cannot be imported: {type(exc).__name__}: {exc}"

BUILD_OPTIONS = {"gpt2": {"lm_head": False}}
PEERS = [("eager", "f32"), ("eager", "f16"), ("eager+graph", "f16"), ("compile", "f16"),
         ("compile", "f32")]
WARMUP = 10


def _tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# ---------------------------------------------------------------- hidetc


def compile_cuda(onnx_path: Path, out: Path, limit: float) -> dict:
    cmd = [sys.executable, "-m", "hidetc.cli", "compile", str(onnx_path), "-o", str(out),
           "--target", "cuda"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(limit, 1),
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"ok": False, "seconds": limit, "error": f"timed out after {limit:.0f}s"}
    seconds = time.perf_counter() - start
    output = _tail(proc.stdout + proc.stderr)
    return {"ok": proc.returncode == 0, "seconds": round(seconds, 1), "rc": proc.returncode,
            "output": output}


def measure_hidetc(out: Path, onnx_path: Path, inputs: dict, repeat: int) -> dict:
    manifest = read_manifest(out)
    if manifest["target"] != "cuda":
        return {"error": f"the artifact targets {manifest['target']}, not cuda"}
    executor = CudaExecutor(out, manifest)
    outputs = executor.run(inputs)
    check = compare(outputs, run_onnxruntime(onnx_path, inputs), rtol=1e-4)
    device = executor.measure(repeat=repeat, warmup=WARMUP)
    wall = []
    for _ in range(min(repeat, 50)):
        start = time.perf_counter()
        executor.run(inputs)
        wall.append((time.perf_counter() - start) * 1e3)
    errors = [o.get("rel_error") for o in check["outputs"].values()]
    return {"status": check["status"], "rel_error": max((e for e in errors if e is not None),
                                                        default=None),
            "device_ms": float(np.median(device)), "min_ms": float(np.min(device)),
            "run_ms": float(np.median(wall)), "graph": executor.uses_graph,
            "graph_unavailable": executor.graph_unavailable,
            "launches": len(manifest.get("cuda", {}).get("launches", [])),
            "verification": manifest.get("verification", {}).get("status")}


# ---------------------------------------------------------------- PyTorch peers (child)


def torch_model(name: str, torch):
    """(module, positional inputs, keyword inputs): f32, random weights, batch 1, on CPU."""
    if name in ("resnet50", "inception_v3", "mobilenet_v2"):
        torchvision = importlib.import_module("torchvision")
        kwargs = {"aux_logits": False, "init_weights": False} if name == "inception_v3" else {}
        module = getattr(torchvision.models, name)(weights=None, **kwargs)
        size = 299 if name == "inception_v3" else 224
        return module, (torch.randn(1, 3, size, size),), {}
    transformers = importlib.import_module("transformers")
    if name == "bert_base":
        module = transformers.BertModel(transformers.BertConfig())
        ids = torch.randint(0, 30522, (1, 128))
        return module, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    module = transformers.GPT2Model(transformers.GPT2Config())
    return module, (), {"input_ids": torch.randint(0, 50257, (1, 128))}


def time_fn(fn, torch, repeat: int) -> float:
    """Median device ms of `fn()` between two CUDA events, after WARMUP calls."""
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def _graphed(fn, torch):
    """`fn` captured once into a CUDA graph (after warm-up on a side stream): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def peer(name: str, mode: str, dtype: str, repeat: int, torch) -> float:
    module, args, kwargs = torch_model(name, torch)
    half = dtype == "f16"
    module = module.eval().cuda()
    module = module.half() if half else module

    def prepare(t):
        return (t.half() if half and t.is_floating_point() else t).cuda()
    args = tuple(prepare(t) for t in args)
    kwargs = {k: prepare(t) for k, t in kwargs.items()}
    with torch.inference_mode():
        if mode == "eager":
            return time_fn(lambda: module(*args, **kwargs), torch, repeat)
        if mode == "eager+graph":
            return time_fn(_graphed(lambda: module(*args, **kwargs), torch), torch, repeat)
        compiled = torch.compile(module, mode="reduce-overhead")
        return time_fn(lambda: compiled(*args, **kwargs), torch, repeat)


def run_peers(name: str, repeat: int) -> int:
    try:
        torch = importlib.import_module("torch")
    except ImportError as exc:
        print(json.dumps({"error": f"torch is not installed ({exc})"}), flush=True)
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for mode, dtype in PEERS:
        start = time.perf_counter()
        try:
            ms = peer(name, mode, dtype, repeat, torch)
            row = {"mode": mode, "dtype": dtype, "median_ms": ms}
        except Exception as exc:  # a peer that fails is a recorded fact, not a crash
            row = {"mode": mode, "dtype": dtype, "error": f"{type(exc).__name__}: {exc}"[:300]}
        row["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(row), flush=True)
    return 0


def measure_peers(name: str, limit: float, repeat: int) -> dict:
    cmd = [sys.executable, __file__, "peers", name, "--repeat", str(repeat)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(limit, 1))
        stdout, note = proc.stdout, None if proc.returncode == 0 else _tail(proc.stderr, 3)
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        note = f"timed out after {limit:.0f}s"
    rows = {}
    for line in stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "mode" in row:
            rows[f"{row['mode']} {row['dtype']}"] = row
        elif "error" in row:
            note = row["error"]
    return {"rows": rows, "note": note}


# ---------------------------------------------------------------- model / report


def run_model(name: str, results: Path, seconds: float, repeat: int, tiny: bool) -> int:
    deadline = time.time() + seconds
    work = Path(os.environ.get("HIDETC_GPU_WORK", "/tmp/hidetc-gpu-check"))
    work.mkdir(parents=True, exist_ok=True)
    record: dict = {"model": name}
    proto = models.build(name, tiny=tiny, **BUILD_OPTIONS.get(name, {}))
    onnx_path = work / f"{name}.onnx"
    models.save(proto, onnx_path)
    inputs = models.sample_inputs(proto, seed=1)
    record["compile"] = compile_cuda(onnx_path, work / f"{name}.out",
                                     min(0.6 * seconds, deadline - time.time() - 30))
    save(results, record)
    if HIDETC_IMPORT_ERROR:
        record["hidetc"] = {"error": HIDETC_IMPORT_ERROR}
    elif record["compile"]["ok"]:
        try:
            record["hidetc"] = measure_hidetc(work / f"{name}.out", onnx_path, inputs, repeat)
        except HidetcError as exc:
            record["hidetc"] = {"error": str(exc)}
        save(results, record)
    record["peers"] = measure_peers(name, deadline - time.time() - 5, repeat)
    save(results, record)
    return 0


def save(results: Path, record: dict) -> None:
    path = results / "results.json"
    doc = json.loads(path.read_text()) if path.is_file() else {"models": {}}
    doc["models"][record["model"]] = record
    path.write_text(json.dumps(doc, indent=1))
    (results / "results.md").write_text(report(doc))


def _cell(row: dict | None) -> str:
    if not row:
        return "-"
    return f"{row['median_ms']:.3f}" if "median_ms" in row else "fail"


def report(doc: dict) -> str:
    env = doc.get("env", {})
    head = ["model", "compile", "check (rel err)", "hidetc ms", "hidetc run() ms"] + \
        [f"{mode} {dtype}" for mode, dtype in PEERS]
    lines = [f"# GPU check {env.get('date', '')}", "",
             f"GPU: {env.get('gpu', '?')}; torch {env.get('torch', '-')}; "
             "median device ms of the forward pass (CUDA events), batch 1; hidetc in f32.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for name, rec in doc.get("models", {}).items():
        comp, ours, peers = rec.get("compile", {}), rec.get("hidetc", {}), rec.get("peers", {})
        check = ours.get("status", "-")
        if ours.get("rel_error") is not None:
            check += f" ({ours['rel_error']:.1e})"
        cells = [name, f"{'ok' if comp.get('ok') else 'FAIL'} {comp.get('seconds', '-')}s",
                 check, f"{ours['device_ms']:.3f}" if "device_ms" in ours else "-",
                 f"{ours['run_ms']:.3f}" if "run_ms" in ours else "-"]
        cells += [_cell(peers.get("rows", {}).get(f"{m} {d}")) for m, d in PEERS]
        lines.append("| " + " | ".join(cells) + " |")
        for what, text in (("compile", None if comp.get("ok") else comp.get("error") or
                            comp.get("output")), ("hidetc", ours.get("error")),
                           ("peers", peers.get("note"))):
            if text:
                notes.append(f"- {name} {what}: " + " / ".join(str(text).splitlines()[-2:]))
        for key, row in peers.get("rows", {}).items():
            if "error" in row:
                notes.append(f"- {name} {key}: {row['error']}")
    return "\n".join(lines + ([""] + notes if notes else [])) + "\n"


def record_env(results: Path) -> int:
    env = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "python": platform.python_version(), "cores": os.cpu_count()}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
        env["gpu"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        env["gpu"] = f"unknown ({exc})"
    for package in ("torch", "torchvision", "transformers", "onnxruntime", "pycuda"):
        try:
            env[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            env[package] = "not installed"
    path = results / "results.json"
    doc = json.loads(path.read_text()) if path.is_file() else {"models": {}}
    doc["env"] = env
    path.write_text(json.dumps(doc, indent=1))
    print(json.dumps(env))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=["env", "model", "peers", "report"])
    p.add_argument("args", nargs="*")
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--repeat", type=int, default=100)
    p.add_argument("--tiny", action="store_true", help="tiny models: a dry run of the script")
    a = p.parse_args(argv)
    if a.command == "peers":
        return run_peers(a.args[0], a.repeat)
    if a.command == "model":
        results = Path(a.args[1])
        results.mkdir(parents=True, exist_ok=True)
        return run_model(a.args[0], results, a.seconds, a.repeat, a.tiny)
    results = Path(a.args[0])
    results.mkdir(parents=True, exist_ok=True)
    if a.command == "env":
        return record_env(results)
    doc = json.loads((results / "results.json").read_text())
    (results / "results.md").write_text(report(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
