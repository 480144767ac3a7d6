"""Concurrent callers and busy machines: hidetc beside ONNX Runtime, in the same run.

    python bench/concurrency.py throughput MODEL.onnx ARTIFACT [--callers 1,2,4]
    python bench/concurrency.py contention MODEL.onnx ARTIFACT [--load "make test"]
                                           [--variants hidetc,libgomp,passive,...]
    python bench/concurrency.py quiet MODEL.onnx ARTIFACT [--variants ...] [--repeats 4]
    python bench/concurrency.py soak [--threads 8] [--runs 1000] [--work DIR]

`throughput`: k threads call one loaded model (hidetc) or one session (ONNX Runtime)
for `--seconds` each, the two alternating over `--rounds` rounds (an idle pause before
each, so neither's spinning workers take the other's cores); reported: runs per second
(the median over rounds) and hidetc's over ORT's. hidetc is timed two ways: `pooled`
(`model.run`: the pool's even share of the cores per pass in flight, the default) and
`all-cores` (each caller on its own context with every core: what the share avoids).

`contention`: the latency ratio hidetc / ORT (single caller, rounds alternating as
`hidetc bench` does) on a quiet machine, then while `--load` runs on the same cores
(default: this repository's `make test` in a copy of the tree, `--load-tree`), per
OpenMP wait-policy variant (`VARIANTS`: environment settings libgomp reads when it
starts, so each variant runs in a child process of its own; a variant's own settings
are the user's, which hidetc keeps; `hidetc` sets none: hidetc's policy). Reported per variant:
quiet ratio, loaded ratio, and loaded / quiet (the issue's bound: 1.1).

`quiet`: the quiet machine only, the variants' children alternating `--repeats` times
(the machine's speed drifts between children, so each child's ratio to ORT in its own
rounds is what compares); reported per variant: the median of the children's ratios.

`soak`: the five tiny benchmark models compiled for the cpu (into `--work`), each
loaded once and run by `--threads` threads x `--runs` passes, every thread on inputs of
its own, each result compared bit for bit with the same inputs run alone on one thread;
reported: the results that differ (must be 0), the contexts the pool made, and the
growth of the heap in use (malloc's count) and of the resident memory (which also holds
the interpreter's and the threads' own pages) over the passes, beside the bound of one
pooled context (arena) and one scratch stack per thread.

`--json FILE` writes the rows and the machine's facts.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx

import hidetc
from hidetc.tools.bench import alternate, paired_ratio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402  (the repository's models package: sample inputs)

PAUSE_S = 0.3      # idle before each timed block: the other runtime's spinners sleep

# libgomp settings, read once when the library starts (each variant: a fresh process)
VARIANTS = {
    "hidetc": {},                                   # hidetc's choice (runtime/wait_policy.py)
    "libgomp": {"GOMP_SPINCOUNT": "300000"},        # libgomp's own default spin
    "passive": {"OMP_WAIT_POLICY": "passive"},
    "active": {"OMP_WAIT_POLICY": "active"},
    "spin1k": {"GOMP_SPINCOUNT": "1000"},
    "spin3k": {"GOMP_SPINCOUNT": "3000"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "spin30k": {"GOMP_SPINCOUNT": "30000"},
    "spin100k": {"GOMP_SPINCOUNT": "100000"},
    "bind-close": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
    "no-bind": {"OMP_PROC_BIND": "false"},
}


def _inputs(model_path: str) -> dict:
    return models.sample_inputs(onnx.load(model_path, load_external_data=False), 0)


def _ort(model_path: str):
    import onnxruntime as ort
    return ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])


def _rate(call, callers: int, seconds: float) -> float:
    """Runs per second of `callers` threads each calling `call(index)` for `seconds`."""
    counts = [0] * callers
    stop = time.perf_counter() + seconds
    barrier = threading.Barrier(callers + 1)

    def work(k: int) -> None:
        barrier.wait()
        while time.perf_counter() < stop:
            call(k)
            counts[k] += 1

    threads = [threading.Thread(target=work, args=(k,)) for k in range(callers)]
    for t in threads:
        t.start()
    begin = time.perf_counter()
    barrier.wait()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - begin)


def throughput(args) -> list[dict]:
    inputs = _inputs(args.model)
    model = hidetc.load(args.artifact)
    session = _ort(args.model)
    cores = model._executor.pool.cores
    rows = []
    for callers in [int(c) for c in args.callers.split(",")]:
        own = [model.context(threads=cores) for _ in range(callers)]
        runners = {"hidetc pooled": lambda k: model.run(inputs),
                   "hidetc all-cores": lambda k: own[k].run(inputs),
                   "onnxruntime": lambda k: session.run(None, inputs)}
        for call in runners.values():
            call(0)
        rates: dict[str, list[float]] = {name: [] for name in runners}
        for _ in range(args.rounds):
            for name, call in runners.items():
                time.sleep(PAUSE_S)
                rates[name].append(_rate(call, callers, args.seconds))
        row = {"callers": callers, **{f"{name} runs/s": float(np.median(r))
                                      for name, r in rates.items()}}
        row["pooled / ort"] = row["hidetc pooled runs/s"] / row["onnxruntime runs/s"]
        row["all-cores / ort"] = row["hidetc all-cores runs/s"] / row["onnxruntime runs/s"]
        rows.append(row)
        print(json.dumps(row), flush=True)
        for context in own:
            context.close()
    return rows


def _latencies(model_path: str, artifact: str, rounds: int, calls: int) -> dict:
    """In this process: hidetc and ORT alternating, `rounds` x `calls` each."""
    inputs = _inputs(model_path)
    model, session = hidetc.load(artifact), _ort(model_path)
    got = alternate({"hidetc": lambda: model.run(inputs),
                     "onnxruntime": lambda: session.run(None, inputs)},
                    repeat=rounds * calls, rounds=rounds, warmup=1, pause=PAUSE_S)
    h, o = got["hidetc"]["median_ms"], got["onnxruntime"]["median_ms"]
    paired = paired_ratio(got["hidetc"]["round_best_ms"], got["onnxruntime"]["round_best_ms"])
    return {"hidetc_ms": h, "onnxruntime_ms": o, "ratio": h / o, "paired": paired}


def _child(variant: str, args) -> dict:
    env = dict(os.environ, **VARIANTS[variant])
    cmd = [sys.executable, __file__, "_latency", args.model, args.artifact,
           "--rounds", str(args.rounds), "--calls", str(args.calls)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"variant {variant}: {proc.stderr.strip().splitlines()[-1:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def quiet(args) -> list[dict]:
    variants = args.variants.split(",")
    seen: dict[str, list[dict]] = {v: [] for v in variants}
    for _ in range(args.repeats):
        for v in variants:
            seen[v].append(_child(v, args))
    rows = []
    for v, runs in seen.items():
        row = {"variant": v, "env": VARIANTS[v], "runs": runs,
               "ratio": float(np.median([r["ratio"] for r in runs])),
               "paired": float(np.median([r["paired"] for r in runs]))}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("variant", "ratio", "paired")}), flush=True)
    return rows


def _start_load(args) -> subprocess.Popen:
    tree = Path(args.load_tree)
    if not (tree / "Makefile").is_file():
        root = Path(__file__).resolve().parents[1]
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree)],
                       check=True, capture_output=True)
    return subprocess.Popen(args.load, shell=True, cwd=tree, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_load(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def contention(args) -> list[dict]:
    variants = args.variants.split(",")
    rows = {v: {"variant": v, "env": VARIANTS[v]} for v in variants}
    for v in variants:
        rows[v]["quiet"] = _child(v, args)
        print(json.dumps(rows[v]), flush=True)
    load = _start_load(args)
    try:
        time.sleep(args.ramp)
        for v in variants:
            if load.poll() is not None:
                raise SystemExit(f"the load ended (exit {load.returncode}) before "
                                 f"variant {v}: give it more work or fewer rounds")
            rows[v]["loaded"] = _child(v, args)
            rows[v]["loaded / quiet"] = rows[v]["loaded"]["ratio"] / rows[v]["quiet"]["ratio"]
            print(json.dumps(rows[v]), flush=True)
    finally:
        _stop_load(load)
    return list(rows.values())


def _rss() -> int:
    """This process's resident bytes (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _heap() -> int:
    """Bytes glibc's malloc has handed out and not taken back (mallinfo2: every arena,
    mmapped blocks included); 0 where the C library has no mallinfo2."""
    import ctypes
    names = ("arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks "
             "keepcost").split()
    info = type("MallInfo2", (ctypes.Structure,), {"_fields_": [(n, ctypes.c_size_t)
                                                                for n in names]})
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "mallinfo2"):
        return 0
    libc.mallinfo2.restype = info
    got = libc.mallinfo2()
    return got.uordblks + got.hblkhd


def soak(args) -> list[dict]:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in sorted(models.REGISTRY):
        proto = models.build(name, tiny=True)
        path = work / f"{name}.onnx"
        models.save(proto, path)
        out = work / name
        if not (out / "manifest.yaml").is_file():
            hidetc.compile_model(path, out, target="cpu")
        model = hidetc.load(out)
        feeds = [models.sample_inputs(proto, seed=k) for k in range(args.threads)]
        model.set_threads(1)
        alone = [model.run(f) for f in feeds]
        model.set_threads(0)
        before, heap = _rss(), _heap()
        wrong = [0] * args.threads

        def work_(k: int) -> None:
            for _ in range(args.runs):
                got = model.run(feeds[k])
                if any(not np.array_equal(got[o], alone[k][o], equal_nan=True) for o in got):
                    wrong[k] += 1
        start = time.perf_counter()
        threads = [threading.Thread(target=work_, args=(k,)) for k in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        memory = model.manifest["memory"]
        bound = args.threads * (memory["context_bytes"]
                                + (memory.get("scratch_bytes_per_thread") or 0))
        row = {"model": name, "threads": args.threads, "runs": args.runs,
               "differ": sum(wrong), "seconds": time.perf_counter() - start,
               "contexts": model._executor.pool.created, "max_contexts": model.max_contexts,
               "rss_growth_bytes": _rss() - before, "heap_growth_bytes": _heap() - heap,
               "bound_bytes": bound}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["throughput", "contention", "quiet", "soak",
                                         "_latency"])
    parser.add_argument("model", nargs="?")
    parser.add_argument("artifact", nargs="?")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--work", default="bench-work/concurrency")
    parser.add_argument("--callers", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--variants", default="hidetc,libgomp")
    parser.add_argument("--load", default="make test")
    parser.add_argument("--load-tree", default="build/load-tree",
                        help="where the load runs (a git worktree of this repository "
                             "is made there when it has no Makefile)")
    parser.add_argument("--ramp", type=float, default=30.0,
                        help="seconds between starting the load and measuring")
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.mode == "_latency":
        print(json.dumps(_latencies(args.model, args.artifact, args.rounds, args.calls)))
        return
    if args.mode != "soak" and not (args.model and args.artifact):
        parser.error(f"{args.mode} needs MODEL.onnx and ARTIFACT")
    modes = {"throughput": throughput, "contention": contention, "quiet": quiet, "soak": soak}
    rows = modes[args.mode](args)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"mode": args.mode, "model": args.model and Path(args.model).name, "rows": rows,
             "machine": {"cores": os.cpu_count(), "processor": platform.processor(),
                         "date": time.strftime("%Y-%m-%d")}}, indent=1) + "\n")


if __name__ == "__main__":
    main()
