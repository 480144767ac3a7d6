"""The ONNX node-test conformance run: every node test of the installed onnx package
through hidetc's compiled CPU path (`hidetc.tools.onnx_backend`), each case isolated.

    python -m hidetc.tools.conformance [--jobs 2] [-k REGEX] [--benchmark-ops]
                                 [--expected tests/conformance/expected_failures.yaml]
                                 [--out DIR] [--write-expected FILE]

Modules: `cases` (the suite, materialized once per onnx version), `worker` (one case:
prepare, run every data set, compare with the official runner's tolerances), `pool`
(worker processes with per-case timeouts: a segfault or hang is a recorded "crash",
never the end of the run), `report` (counts, causes ranked, the expected-failure list).
Statuses: pass, fail (outputs differ), error (prepare/run raised: a clean `HidetcError`
unless marked internal), crash (the worker died or timed out), skip (not run: training
ops).
"""
from hidetc.tools.conformance.cases import Case, benchmark_ops, load_cases, select
from hidetc.tools.conformance.pool import run_cases
from hidetc.tools.conformance.report import (
    cause,
    compare_expected,
    counts,
    load_expected,
    summary_text,
    write_expected,
)

__all__ = ["Case", "benchmark_ops", "load_cases", "select", "run_cases", "cause",
           "compare_expected", "counts", "load_expected", "summary_text", "write_expected"]
