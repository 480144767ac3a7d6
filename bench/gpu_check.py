"""The per-model half of the one-shot GPU check (bench/gpu_check.sh drives it).

    python bench/gpu_check.py env RESULTS_DIR               # GPU, driver, package versions
    python bench/gpu_check.py model NAME RESULTS_DIR --seconds S [--repeat N] [--tiny]
                                    [--precisions f16,f32]
    python bench/gpu_check.py peers NAME --seconds S [--repeat N]   # child: JSON lines
    python bench/gpu_check.py report RESULTS_DIR            # results.md from results.json

`model` builds the ONNX model (batch 1, random weights; GPT-2 without the LM head, as
transformers' GPT2Model) and compiles it twice, `hidetc compile --target cuda
--precision f16` and `--precision f32` (two artifacts, compiled in parallel, with
--no-verify: the check below records the error even when it is over the tolerance, so
a failing artifact is still timed; and --no-tune where the CLI has a tuner, unless
$GPU_CHECK_COMPILE_ARGS says otherwise: see `compile_flags`). Each artifact runs with
CudaExecutor, is compared with ONNX Runtime (norm-wise relative error per output, bound
1e-2 for f16, 1e-4 for f32) and timed (CUDA events around the graph replay, median of N
after warm-up). Then
the PyTorch peers run in a child process (its own session, killed as a group when its
time is up), same model definitions (torchvision, transformers), in this order so the
likely fastest peers of both precisions come first:
    eager+graph f16, eager+graph f32, eager+graph-cl f16 (CNNs only), compile f16,
    eager f16, eager f32, compile f32
eager+graph = eager replayed from a CUDA graph; -cl: with channels_last tensors (cuDNN's
fast f16 convolutions); compile = torch.compile(mode="reduce-overhead") (Inductor with
CUDA graphs; its first call compiles: tens of seconds); eager is host-bound at batch 1.
f32 peers run with TF32 off (hidetc's f32 must meet 1e-4); cudnn.benchmark is on. A peer
the time box cannot fit is recorded as skipped.

Each precision's hidetc time is reported as a ratio to the fastest peer of the same
precision (target: f16 <= 0.8, f32 <= 0.9) and to every peer. Every step is bounded by
`--seconds`; results.json and results.md are rewritten after each step, so a timeout
keeps what was measured. results.md also embeds cuda_ops.md (bench/cuda_ops.py) when
present. torch, torchvision and transformers are optional and imported only in the
`peers` child, so the hidetc half never pays for them.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import importlib.metadata
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import models  # noqa: E402

try:  # a broken hidetc is recorded per model; the env and the peers are measured anyway
    from hidetc.runtime.artifact import read_manifest
    from hidetc.runtime.cuda import CudaExecutor
    from hidetc.verify import compare, run_onnxruntime
    HIDETC_IMPORT_ERROR = None
except Exception as exc:
    HIDETC_IMPORT_ERROR = f"hidetc cannot be imported: {type(exc).__name__}: {exc}"

BUILD_OPTIONS = {"gpt2": {"lm_head": False}}
PRECISIONS = ("f16", "f32")
TOLERANCE = {"f16": 1e-2, "f32": 1e-4}
TARGET = {"f16": 0.8, "f32": 0.9}            # hidetc / fastest peer of the precision
VISION = ("resnet50", "inception_v3", "mobilenet_v2")
PEERS = [("eager+graph", "f16"), ("eager+graph", "f32"), ("eager+graph-cl", "f16"),
         ("compile", "f16"), ("eager", "f16"), ("eager", "f32"), ("compile", "f32")]
MODES = ["eager", "eager+graph", "eager+graph-cl", "compile"]
MIN_SECONDS = {"compile": 20.0}               # a peer is started only with this much left
WARMUP = 10


def _tail(text: str, lines: int = 6) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


CHILDREN: set[int] = set()      # process groups of the running children


def _terminated(signum, frame):
    """SIGTERM (gpu_check.sh's `timeout`): take the children's sessions down too."""
    for pid in list(CHILDREN):
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    sys.exit(128 + signum)


def run_bounded(cmd: list[str], limit: float) -> tuple[int | None, str]:
    """Run `cmd` in its own session for at most `limit` seconds; on timeout kill its
    whole process group (nvcc jobs, Inductor's compile workers). (rc or None, output)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=ROOT, start_new_session=True)
    CHILDREN.add(proc.pid)
    try:
        out, _ = proc.communicate(timeout=max(limit, 1))
        return proc.returncode, out
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out or ""
    finally:
        CHILDREN.discard(proc.pid)


# ---------------------------------------------------------------- hidetc


def compile_flags() -> list[str]:
    """Extra `hidetc compile` options: $GPU_CHECK_COMPILE_ARGS when set (e.g. "--tune
    --space 1", or "--records FILE" to apply carried tuning records), else --no-tune
    where the CLI has a tuner (it would tune on the GPU machine by default: minutes per
    model, past the time box), so the templates' default configs are what is measured."""
    extra = os.environ.get("GPU_CHECK_COMPILE_ARGS")
    if extra is not None:
        return shlex.split(extra)
    try:
        from hidetc.cli import compile_cmd as command
        names = {param.name for param in command.params}
    except Exception:
        return []
    return ["--no-tune"] if "tune" in names else []


def compile_cmd(onnx_path: Path, out: Path, precision: str) -> list[str]:
    return [sys.executable, "-m", "hidetc.cli", "compile", str(onnx_path), "-o", str(out),
            "--target", "cuda", "--precision", precision, "--no-verify", *compile_flags()]


def compile_all(onnx_path: Path, outs: dict[str, Path], limit: float) -> dict[str, dict]:
    """Both precisions' compiles in parallel (each one's Python half is single-threaded)."""
    def one(item):
        precision, out = item
        start = time.perf_counter()
        rc, text = run_bounded(compile_cmd(onnx_path, out, precision), limit)
        result = {"ok": rc == 0, "rc": rc, "output": _tail(text),
                  "seconds": round(time.perf_counter() - start, 1)}
        if rc is None:
            result["error"] = f"timed out after {limit:.0f}s"
        return precision, result
    with ThreadPoolExecutor(len(outs) or 1) as pool:
        return dict(pool.map(one, outs.items()))


def measure_hidetc(out: Path, inputs: dict, reference: dict, precision: str,
                   repeat: int) -> dict:
    manifest = read_manifest(out)
    if manifest["target"] != "cuda":
        return {"error": f"the artifact targets {manifest['target']}, not cuda"}
    executor = CudaExecutor(out, manifest)
    try:
        check = compare(executor.run(inputs), reference, rtol=TOLERANCE[precision])
        device = executor.measure(repeat=repeat, warmup=WARMUP)
        wall = []
        for _ in range(min(repeat, 50)):
            start = time.perf_counter()
            executor.run(inputs)
            wall.append((time.perf_counter() - start) * 1e3)
    finally:
        executor.close()
    errors = [o.get("rel_error") for o in check["outputs"].values()]
    return {"status": check["status"], "rtol": TOLERANCE[precision],
            "rel_error": max((e for e in errors if e is not None), default=None),
            "device_ms": float(np.median(device)), "min_ms": float(np.min(device)),
            "run_ms": float(np.median(wall)), "graph": executor.uses_graph,
            "graph_unavailable": executor.graph_unavailable,
            "precision": manifest.get("precision", "f32"),
            "launches": len(manifest.get("cuda", {}).get("launches", []))}


# ---------------------------------------------------------------- PyTorch peers (child)


def torch_model(name: str, torch):
    """(module, positional inputs, keyword inputs): f32, random weights, batch 1, on CPU."""
    if name in VISION:
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


class Peers:
    """The model built once (f32, CPU); per precision a GPU copy, made on first use."""

    def __init__(self, name: str, torch):
        self.name, self.torch = name, torch
        self.base, self.args, self.kwargs = torch_model(name, torch)
        self.base.eval()
        self.copies: dict[str, tuple] = {}

    def inputs(self, dtype: str, channels_last: bool = False):
        torch, key = self.torch, (dtype, channels_last)
        if key not in self.copies:
            half = dtype == "f16"
            module = copy.deepcopy(self.base).cuda()
            module = module.half() if half else module

            def prepare(t):
                t = (t.half() if half and t.is_floating_point() else t).cuda()
                return t.contiguous(memory_format=torch.channels_last) \
                    if channels_last and t.dim() == 4 else t
            if channels_last:
                module = module.to(memory_format=torch.channels_last)
            self.copies[key] = (module, tuple(prepare(t) for t in self.args),
                                {k: prepare(t) for k, t in self.kwargs.items()})
        return self.copies[key]

    def time(self, mode: str, dtype: str, repeat: int) -> float:
        module, args, kwargs = self.inputs(dtype, mode == "eager+graph-cl")
        torch = self.torch
        with torch.inference_mode():
            if mode == "eager":
                return time_fn(lambda: module(*args, **kwargs), torch, repeat)
            if mode in ("eager+graph", "eager+graph-cl"):
                return time_fn(_graphed(lambda: module(*args, **kwargs), torch), torch, repeat)
            compiled = torch.compile(module, mode="reduce-overhead")
            return time_fn(lambda: compiled(*args, **kwargs), torch, repeat)


def run_peers(name: str, seconds: float, repeat: int) -> int:
    deadline = time.time() + seconds
    try:
        torch = importlib.import_module("torch")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = True
        peers = Peers(name, torch)
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}), flush=True)
        return 0
    for mode, dtype in PEERS:
        if mode == "eager+graph-cl" and name not in VISION:
            continue
        row = {"mode": mode, "dtype": dtype}
        if deadline - time.time() < MIN_SECONDS.get(mode, 3.0):
            print(json.dumps(dict(row, error="skipped: out of time")), flush=True)
            continue
        start = time.perf_counter()
        try:
            row["median_ms"] = peers.time(mode, dtype, repeat)
        except Exception as exc:  # a peer that fails is a recorded fact, not a crash
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        row["seconds"] = round(time.perf_counter() - start, 1)
        print(json.dumps(row), flush=True)
    return 0


def measure_peers(name: str, limit: float, repeat: int) -> dict:
    rc, stdout = run_bounded([sys.executable, __file__, "peers", name, "--repeat", str(repeat),
                              "--seconds", str(max(limit - 5, 1))], limit)
    note = f"timed out after {limit:.0f}s" if rc is None else \
        None if rc == 0 else _tail(stdout, 3)
    rows = {}
    for line in stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "mode" in row:
            rows[f"{row['mode']} {row['dtype']}"] = row
        elif isinstance(row, dict) and "error" in row:
            note = row["error"]
    return {"rows": rows, "note": note}


# ---------------------------------------------------------------- model / report


def run_model(name: str, results: Path, seconds: float, repeat: int, tiny: bool,
              precisions: list[str]) -> int:
    deadline = time.time() + seconds
    work = Path(os.environ.get("HIDETC_GPU_WORK", "/tmp/hidetc-gpu-check"))
    work.mkdir(parents=True, exist_ok=True)
    record: dict = {"model": name, "tiny": tiny, "compile_flags": compile_flags(),
                    "precisions": {p: {} for p in precisions}}
    proto = models.build(name, tiny=tiny, **BUILD_OPTIONS.get(name, {}))
    onnx_path = work / f"{name}.onnx"
    models.save(proto, onnx_path)
    inputs = models.sample_inputs(proto, seed=1)
    outs = {p: work / f"{name}.{p}.out" for p in precisions}
    compiled = compile_all(onnx_path, outs, min(0.5 * seconds, deadline - time.time() - 20))
    for p in precisions:
        record["precisions"][p]["compile"] = compiled[p]
    save(results, record)
    reference = None
    for p in precisions:
        if HIDETC_IMPORT_ERROR:
            record["precisions"][p]["hidetc"] = {"error": HIDETC_IMPORT_ERROR}
            continue
        if not compiled[p]["ok"]:
            continue
        try:
            reference = reference or run_onnxruntime(onnx_path, inputs)
            record["precisions"][p]["hidetc"] = measure_hidetc(outs[p], inputs, reference, p,
                                                               repeat)
        except Exception as exc:    # a HidetcError or any crash: recorded
            record["precisions"][p]["hidetc"] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        save(results, record)
    record["peers"] = measure_peers(name, deadline - time.time() - 5, repeat)
    save(results, record)
    return 0


def ratios(record: dict) -> dict:
    """Per precision: hidetc ms / each peer's ms of that precision, and the fastest."""
    out = {}
    rows = record.get("peers", {}).get("rows", {})
    for p, rec in record.get("precisions", {}).items():
        ours = rec.get("hidetc", {}).get("device_ms")
        peers = {k: r["median_ms"] for k, r in rows.items()
                 if r.get("dtype") == p and "median_ms" in r}
        fastest = min(peers, key=peers.get) if peers else None
        ratio = ours / peers[fastest] if ours and fastest else None
        out[p] = {"fastest": fastest, "fastest_ms": peers.get(fastest), "ratio": ratio,
                  "target": TARGET[p], "met": None if ratio is None else ratio <= TARGET[p],
                  "per_peer": {k: ours / v for k, v in peers.items()} if ours else {}}
    return out


def save(results: Path, record: dict) -> None:
    record["ratios"] = ratios(record)
    path = results / "results.json"
    doc = json.loads(path.read_text()) if path.is_file() else {"models": {}}
    doc.setdefault("models", {})[record["model"]] = record
    path.write_text(json.dumps(doc, indent=1))
    (results / "results.md").write_text(report(doc, results))


def _peer_cell(row: dict | None, ours: float | None) -> str:
    if not row:
        return "-"
    if "median_ms" not in row:
        return "skipped" if "skipped" in row.get("error", "") else "fail"
    ratio = f" ({ours / row['median_ms']:.2f})" if ours else ""
    return f"{row['median_ms']:.3f}{ratio}"


def report(doc: dict, results: Path | None = None) -> str:
    env = doc.get("env", {})
    flags = next((r["compile_flags"] for r in doc.get("models", {}).values()
                  if r.get("compile_flags")), [])
    head = ["model", "prec", "compile", "check (rel err)", "hidetc ms", "run() ms",
            "fastest peer", "hidetc / fastest", "target", "met"] + MODES
    lines = [f"# GPU check {env.get('date', '')}", "",
             f"GPU: {env.get('gpu', '?')}; torch {env.get('torch', '-')}; median device ms "
             "of the forward pass (CUDA events), batch 1. Peer cells: ms (hidetc / peer), "
             "same precision; f32 peers with TF32 off. hidetc compile flags: "
             f"{' '.join(flags) if flags else '-'}.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for name, rec in doc.get("models", {}).items():
        peers, rows = rec.get("peers", {}), rec.get("peers", {}).get("rows", {})
        rat = rec.get("ratios") or ratios(rec)
        for p, prec in rec.get("precisions", {}).items():
            comp, ours = prec.get("compile", {}), prec.get("hidetc", {})
            check = ours.get("status", "-")
            if ours.get("rel_error") is not None:
                check += f" ({ours['rel_error']:.1e})"
            r = rat.get(p, {})
            fastest = f"{r['fastest']} {r['fastest_ms']:.3f}" if r.get("fastest") else "-"
            ms = ours.get("device_ms")
            cells = [name + (" (tiny)" if rec.get("tiny") else ""), p,
                     f"{'ok' if comp.get('ok') else 'FAIL'} {comp.get('seconds', '-')}s", check,
                     f"{ms:.3f}" if ms else "-",
                     f"{ours['run_ms']:.3f}" if "run_ms" in ours else "-", fastest,
                     f"{r['ratio']:.2f}" if r.get("ratio") else "-", f"<= {TARGET[p]}",
                     {True: "yes", False: "NO", None: "-"}[r.get("met")]]
            cells += [_peer_cell(rows.get(f"{m} {p}"), ms) for m in MODES]
            lines.append("| " + " | ".join(cells) + " |")
            for what, text in (("compile", None if comp.get("ok") else comp.get("error") or
                                comp.get("output")), ("hidetc", ours.get("error"))):
                if text:
                    notes.append(f"- {name} {p} {what}: " +
                                 " / ".join(str(text).splitlines()[-2:]))
        if peers.get("note"):
            notes.append(f"- {name} peers: {peers['note']}")
        for key, row in rows.items():
            if "error" in row and "skipped" not in row["error"]:
                notes.append(f"- {name} {key}: {row['error']}")
    text = "\n".join(lines + ([""] + notes if notes else [])) + "\n"
    ops = results / "cuda_ops.md" if results else None
    if ops and ops.is_file():
        text += "\n" + ops.read_text().replace("# CUDA templates", "## CUDA templates", 1)
    return text


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
    p.add_argument("--precisions", default=",".join(PRECISIONS))
    a = p.parse_args(argv)
    if a.command == "peers":
        return run_peers(a.args[0], a.seconds, a.repeat)
    if a.command == "model":
        signal.signal(signal.SIGTERM, _terminated)
        results = Path(a.args[1])
        results.mkdir(parents=True, exist_ok=True)
        precisions = [x for x in a.precisions.split(",") if x]
        bad = [x for x in precisions if x not in PRECISIONS]
        if bad:
            p.error(f"unknown precision(s) {bad}; choose from {list(PRECISIONS)}")
        return run_model(a.args[0], results, a.seconds, a.repeat, a.tiny, precisions)
    results = Path(a.args[0])
    results.mkdir(parents=True, exist_ok=True)
    if a.command == "env":
        return record_env(results)
    path = results / "results.json"
    doc = json.loads(path.read_text()) if path.is_file() else {"models": {}}
    (results / "results.md").write_text(report(doc, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
