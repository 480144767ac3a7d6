"""`python -m hidetc.tools.conformance`: run the ONNX backend tests (`--suite node`, the
default, or `models`: the small models onnx ships) through a backend, print the counts
and the failure causes, write per-case results to JSON, and compare with the suite's
expected-failure list.

Exit status: 0 when the run matches the expected-failure list (or no list is given),
1 when it does not (a failure missing from the list, or a listed case that passes),
2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import onnx

from hidetc.tools.conformance.cases import SUITES, benchmark_ops, load_cases, select
from hidetc.tools.conformance.pool import run_cases
from hidetc.tools.conformance.report import (
    FAILING,
    compare_expected,
    load_expected,
    load_expected_groups,
    ranked_ops,
    summary_text,
    write_expected,
)

DEFAULT_EXPECTED = {"node": Path("tests/conformance/expected_failures.yaml"),
                    "models": Path("tests/conformance/expected_failures_models.yaml")}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hidetc.tools.conformance", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="worker processes (default: 2, or 1 on one core)")
    p.add_argument("--timeout", type=float, default=180.0,
                   help="seconds per case (compile + every data set) before it is a crash")
    p.add_argument("--suite", choices=sorted(SUITES), default="node",
                   help="node: one test per op; models: onnx's small model tests")
    p.add_argument("-k", "--filter", help="only cases whose name matches this regex")
    p.add_argument("--ops", help="only cases of these ops (comma-separated)")
    p.add_argument("--benchmark-ops", action="store_true",
                   help="only cases of the ops the five benchmark models use")
    p.add_argument("--backend", default="hidetc",
                   help="hidetc, onnxruntime (checks the harness) or module:attr")
    p.add_argument("--device", default="CPU")
    p.add_argument("--expected", type=Path,
                   help=f"expected-failure list to compare with (default: {DEFAULT_EXPECTED} "
                        f"when it exists and the backend is hidetc)")
    p.add_argument("--no-expected", action="store_true", help="do not compare with a list")
    p.add_argument("--out", type=Path, help="write results.json and the worker logs here")
    p.add_argument("--write-expected", type=Path, metavar="FILE",
                   help="write this run's failures as the expected-failure list")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    return p


def _progress(quiet: bool):
    start, last = time.monotonic(), [0.0]
    tally: dict[str, int] = {}

    def report(done: int, total: int, result: dict) -> None:
        tally[result["status"]] = tally.get(result["status"], 0) + 1
        now = time.monotonic()
        if result["status"] == "crash" and not quiet:
            print(f"  crash: {result['name']}: {result['reason']}", file=sys.stderr, flush=True)
        if quiet or (now - last[0] < 15 and done != total):
            return
        last[0] = now
        counts = " ".join(f"{k} {v}" for k, v in sorted(tally.items()))
        print(f"[{done:4d}/{total}] {counts}  ({now - start:.0f} s)", file=sys.stderr,
              flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    ops = [o.strip() for o in args.ops.split(",")] if args.ops else None
    if args.benchmark_ops:
        ops = sorted(set(ops or ()) | set(benchmark_ops()))
    suite = load_cases(suite=args.suite)
    cases = select(suite, args.filter, ops)
    if args.list:
        for c in cases:
            print(f"{c.name}  {c.op}  opset {c.opset}")
        return 0
    expected_path = args.expected
    if expected_path is None and not args.no_expected and args.backend == "hidetc" \
            and DEFAULT_EXPECTED[args.suite].is_file():
        expected_path = DEFAULT_EXPECTED[args.suite]
    start = time.monotonic()
    log_dir = args.out / "logs" if args.out else None
    results = run_cases(cases, backend=args.backend, device=args.device, jobs=args.jobs,
                        timeout=args.timeout, log_dir=log_dir,
                        progress=_progress(args.quiet))
    elapsed = time.monotonic() - start
    print(f"\nbackend {args.backend} on {args.device}, onnx {onnx.__version__}, "
          f"{args.jobs} worker(s), {elapsed:.0f} s")
    print(summary_text(results))
    worst = ranked_ops(results)[:25]
    if worst:
        print("\nops with failing cases (failing/total):")
        print("  " + ", ".join(f"{op} {n}/{t}" for op, n, t in worst))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"backend": args.backend, "device": args.device, "onnx": onnx.__version__,
             "seconds": round(elapsed, 1), "results": results}, indent=1))
        print(f"\nper-case results: {args.out / 'results.json'}")
    if args.write_expected:
        ran = {r["name"] for r in results}
        op_of = {c.name: c.op for c in suite}
        carried = {} if not args.write_expected.is_file() else {
            name: (text, op_of.get(name, op))
            for name, (text, op) in load_expected_groups(args.write_expected).items()
            if name not in ran}
        n = write_expected(results, args.write_expected, onnx.__version__, carried)
        print(f"wrote {n} expected failure(s) to {args.write_expected}")
        return 0
    if expected_path is None:
        return 0
    comparison = compare_expected(results, load_expected(expected_path),
                                  [c.name for c in suite])
    print(f"\ncompared with {expected_path}:")
    print(comparison.text())
    failing = sum(r["status"] in FAILING for r in results)
    print(f"expected failures listed: {len(load_expected(expected_path))}; failing now: "
          f"{failing}")
    return 0 if comparison.ok else 1


if __name__ == "__main__":
    sys.exit(main())
