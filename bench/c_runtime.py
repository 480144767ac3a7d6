"""The C runtime beside the Python runtime and beside the bare kernel library.

    python bench/c_runtime.py overhead [--work DIR] [--calls 2000] [--blocks 25]
    python bench/c_runtime.py models [--tiny] [--models resnet50,bert_base] [--runs 30]
                                     [--rounds 3] [--work DIR] [--json FILE]

`overhead`: a tiny model (Relu on 16 floats) compiled for the cpu; `bench/c/overhead.c`
calls its `hidetc_forward` directly (the library opened by path, the weights mapped,
one arena) and through `hidetc_context_run`, in alternating blocks; reported: the median
microseconds per call of each and the runtime's overhead (the issue's bound: 20 us).

`models`: the five benchmark models (`python -m models --list`; `--tiny` for the small
variants) compiled for the cpu into `--work`, then per round: `hidetc.load(OUT).run`
timed over `--runs` passes (wall time per call, Python's checks and output arrays
included), and `OUT/bin/hidetc-run --repeat RUNS` (wall time per `hidetc_context_run`;
reading and writing .npy outside the timing); reported: the medians of each and the
ratio hidetc-run / Python (the bound: <= 1), and whether hidetc-run's outputs equal the
Python runtime's bit for bit. Both on the same cores and thread count (all cores).
`--json FILE` writes the rows and the machine's facts.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import hidetc  # noqa: E402
import models  # noqa: E402
from hidetc.backends.runtime import c_build  # noqa: E402

FIVE = ("resnet50", "inception_v3", "mobilenet_v2", "bert_base", "gpt2")


def log(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def overhead(args) -> list[dict]:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]),
              work / "tiny.onnx")
    out = work / "tiny"
    hidetc.compile_model(work / "tiny.onnx", out, target="cpu")
    built = c_build.build_runtime()
    exe = work / "overhead"
    subprocess.run(["gcc", "-std=c11", "-O2", f"-I{built / 'include'}",
                    str(ROOT / "bench" / "c" / "overhead.c"), f"-L{built / 'lib'}",
                    "-lhidetc_runtime", f"-Wl,-rpath,{built / 'lib'}", "-ldl", "-o", str(exe)],
                   check=True)
    proc = subprocess.run([str(exe), str(out), str(args.calls), str(args.blocks)],
                          capture_output=True, text=True, check=True)
    row = {k: float(v) for k, v in (p.split("=") for p in proc.stdout.split())}
    log(f"tiny model: direct {row['direct_us']:.2f} us, through the C runtime "
        f"{row['runtime_us']:.2f} us, overhead {row['overhead_us']:.2f} us per call")
    return [{"bench": "overhead", **row}]


def _python_ms(model, feeds: dict, runs: int) -> float:
    model.run(feeds)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        model.run(feeds)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _runner_ms(out: Path, files: dict, runs: int, outdir: Path) -> float:
    cmd = [str(out / "bin" / "hidetc-run"), str(out), "--repeat", str(runs),
           "--output-dir", str(outdir)]
    for name, path in files.items():
        cmd += ["--input", f"{name}={path}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    fields = dict(p.split("=", 1) for p in proc.stdout.split() if "=" in p)
    return float(fields["median_ms"])


def bench_models(args) -> list[dict]:
    work = Path(args.work)
    rows = []
    for name in args.models.split(","):
        proto = models.build(name, tiny=args.tiny)
        path = work / f"{name}{'_tiny' if args.tiny else ''}.onnx"
        out = path.with_suffix("")
        if not (out / "manifest.yaml").is_file():
            work.mkdir(parents=True, exist_ok=True)
            models.save(proto, path)
            log(f"{name}: compiling")
            hidetc.compile_model(path, out, target="cpu", tune=False)   # (the default
            # configs: both runtimes run the same artifact, whatever its kernels)
        feeds = models.sample_inputs(proto, seed=0)
        files = {}
        for k, (key, array) in enumerate(feeds.items()):
            files[key] = work / f"{out.name}.in{k}.npy"
            np.save(files[key], array)
        model = hidetc.load(out)
        py, cr = [], []
        for _ in range(args.rounds):
            py.append(_python_ms(model, feeds, args.runs))
            cr.append(_runner_ms(out, files, args.runs, work / f"{out.name}.outs"))
        want = model.run(feeds)
        same = all(np.load(work / f"{out.name}.outs" / f"{k}.npy").tobytes() == v.tobytes()
                   for k, v in want.items())
        row = {"bench": "models", "model": name, "tiny": args.tiny,
               "python_ms": statistics.median(py), "hidetc_run_ms": statistics.median(cr),
               "identical": same}
        row["ratio"] = row["hidetc_run_ms"] / row["python_ms"]
        log(f"{name}: python {row['python_ms']:.3f} ms, hidetc-run {row['hidetc_run_ms']:.3f} "
            f"ms, ratio {row['ratio']:.3f}, identical outputs: {same}")
        rows.append(row)
        model.close()
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("overhead", "models"))
    parser.add_argument("--work", default="build/bench-c-runtime")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--blocks", type=int, default=25)
    parser.add_argument("--models", default=",".join(FIVE))
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    rows = overhead(args) if args.mode == "overhead" else bench_models(args)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": {"cpu": platform.processor() or platform.machine(),
                         "python": platform.python_version()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
