"""The ONNX node tests through hidetc's compiled CPU path, checked against the reviewed
expected-failure list (tests/conformance/expected_failures.yaml).

Default suite: every node test of every op the five benchmark models use (op types read
from the builders in models/; ~390 cases, about a minute cold on 2 cores while most of
them stop at the importer, a few seconds with the build cache warm). Slow suite
(`make test-slow`, or `make conformance` for the printed counts): all ~1,880 cases.
Both fail on a failure missing from the list (a regression, named with its cause) and on
a listed case that passes (an unexpected pass: remove it from the list).
"""
from __future__ import annotations

import os
from pathlib import Path

import onnx
import pytest
import yaml

from hidetc.tools.conformance import (
    benchmark_ops,
    compare_expected,
    load_cases,
    load_expected,
    select,
)
from hidetc.tools.conformance.pool import run_cases
from hidetc.tools.conformance.report import FAILING, counts_line, summary_text

EXPECTED = Path(__file__).with_name("expected_failures.yaml")
JOBS = min(2, os.cpu_count() or 1)


@pytest.fixture(scope="module")
def suite():
    return load_cases()


def test_expected_list_is_well_formed(suite):
    data = yaml.safe_load(EXPECTED.read_text())
    names = [n for group in data["groups"] for n in group["cases"]]
    assert len(names) == len(set(names)), "a case is listed twice"
    for group in data["groups"]:
        assert group["cause"].strip() and group["count"] == len(group["cases"]), group["cause"]
    if data["onnx"] == onnx.__version__:
        missing = sorted(set(names) - {c.name for c in suite})
        assert not missing, f"listed cases not in onnx {onnx.__version__}'s suite: {missing}"


def _check(cases, log_dir: Path) -> list[dict]:
    results = run_cases(cases, jobs=JOBS, timeout=180, log_dir=log_dir)
    comparison = compare_expected(results, load_expected(EXPECTED))
    assert comparison.ok, f"{comparison.text()}\n\n{summary_text(results)}"
    return results


def test_benchmark_op_node_tests(suite, tmp_path):
    ops = benchmark_ops()
    assert {"Conv", "MatMul", "Softmax", "LayerNormalization"} <= set(ops)
    cases = select(suite, ops=ops)
    assert len(cases) > 300
    results = _check(cases, tmp_path)
    print(counts_line(results))
    assert not [r["name"] for r in results if r["status"] == "crash"]


@pytest.mark.slow
def test_full_node_suite(suite, tmp_path):
    results = _check(suite, tmp_path)
    print(counts_line(results))
    assert sum(r["status"] in FAILING for r in results) == len(load_expected(EXPECTED))
