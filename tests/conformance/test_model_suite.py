"""onnx's small model tests (`--suite models`: its simple graphs and PyTorch's module and
operator exports, models nobody here wrote) through hidetc's compiled CPU path, checked
against the reviewed list tests/conformance/expected_failures_models.yaml: a failure
missing from it (a regression) and a listed case that passes both fail. About 30 s cold
on 2 cores."""
from __future__ import annotations

import os
from pathlib import Path

from hidetc.tools.conformance import compare_expected, load_cases, load_expected
from hidetc.tools.conformance.pool import run_cases
from hidetc.tools.conformance.report import FAILING, counts_line, summary_text

EXPECTED = Path(__file__).with_name("expected_failures_models.yaml")


def test_model_suite(tmp_path):
    cases = load_cases(suite="models")
    assert len(cases) > 100
    results = run_cases(cases, jobs=min(2, os.cpu_count() or 1), timeout=180,
                        log_dir=tmp_path)
    comparison = compare_expected(results, load_expected(EXPECTED))
    assert comparison.ok, f"{comparison.text()}\n\n{summary_text(results)}"
    print(counts_line(results))
    assert not [r["name"] for r in results if r["status"] in ("crash", "fail")]
    assert sum(r["status"] in FAILING for r in results) == len(load_expected(EXPECTED))
