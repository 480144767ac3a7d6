"""The GPU check's driver (bench/gpu_check.py) without a GPU: a step that hangs is killed
at its cap and the next one runs, a crash is that step's row, steps that need the GPU
are skipped with the device's reason while the rest run, results.json/results.md are
written, the summary fits the device tool's 12,000-character tail, ratios follow the
peers. The whole dry run is a slow test (`make test-slow`)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_check  # noqa: E402
import gpu_report  # noqa: E402


def _run(tmp_path: Path, budget: float = 60.0, device: str = "none") -> gpu_check.Run:
    for sub in ("logs", "steps"):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
    return gpu_check.Run(tmp_path, "gpu", time.time() + budget, sys.executable,
                         device=device, device_note="no pycuda here", work=tmp_path / "work")


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_a_hanging_step_is_killed_at_its_cap(tmp_path):
    run = _run(tmp_path)
    start = time.time()
    entry = gpu_check.execute(gpu_check.Step("hang", 2, _py(
        "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', "
        "'import time; time.sleep(60)']); print('started', flush=True); time.sleep(60)")), run)
    assert entry["status"] == "timeout" and time.time() - start < 20
    assert "killed at its 2 s limit" in entry["reason"] and entry["tail"] == ["started"]
    assert (tmp_path / "logs" / "hang.log").read_text().strip() == "started"


def test_a_crash_is_its_row_and_figures_decide_the_status(tmp_path):
    run = _run(tmp_path)
    crash = gpu_check.execute(gpu_check.Step("crash", 10, _py(
        "import sys; print('boom'); sys.exit(3)")), run)
    assert crash["status"] == "failed" and crash["rc"] == 3 and crash["tail"] == ["boom"]
    written = gpu_check.execute(gpu_check.Step("fig", 10, _py(
        "import json, sys; json.dump({'status': 'compiled', 'x': 1}, open(sys.argv[1], 'w'))")
        + ["{figures}"]), run)
    assert written["status"] == "compiled" and written["figures"]["x"] == 1


def test_skips_name_their_reason(tmp_path, monkeypatch):
    run = _run(tmp_path)
    gpu_step = gpu_check.Step("needs_gpu", 10, _py("pass"), needs="gpu")
    assert gpu_check.execute(gpu_step, run) == {
        "cap_s": 10, "status": "skipped", "reason": "no GPU (no pycuda here)", "seconds": 0}
    late = _run(tmp_path, budget=gpu_check.REPORT_S + 3)
    assert gpu_check.execute(gpu_check.Step("late", 10, _py("pass")), late)["reason"] == \
        "out of time"
    monkeypatch.setattr(gpu_check.importlib.util, "find_spec", lambda name: None)
    assert gpu_check.execute(gpu_check.Step("p", 10, _py("pass"), needs="torch"), run)[
        "reason"] == "torch is not installed"


def test_junit_failures_are_counted_and_named(tmp_path):
    path = tmp_path / "r.xml"
    path.write_text('<testsuites><testsuite><testcase name="a"/><testcase name="b">'
                    '<failure message="AssertionError: ldmatrix x4 lane 3&#10;more"/>'
                    '</testcase><testcase name="c"><skipped/></testcase></testsuite>'
                    '</testsuites>')
    assert gpu_check.junit_figures(path) == {
        "passed": 1, "failed": 1, "skipped": 1,
        "failures": ["b: AssertionError: ldmatrix x4 lane 3"]}


def test_results_go_under_out_when_it_is_set(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    assert gpu_check.results_dir(Path("elsewhere")) == tmp_path / "gpu"
    monkeypatch.delenv("OUT")
    assert gpu_check.results_dir(Path("elsewhere")) == Path("elsewhere")
    assert gpu_check.results_dir(None).parent == ROOT / "bench" / "results"


def _doc(models=5, error="x" * 2000) -> dict:
    steps = {f"step_{i}": {"status": "failed", "seconds": 1, "figures": {"error": error}}
             for i in range(40)}
    doc = {"mode": "gpu", "budget_s": 460, "steps": steps, "models": {}, "peers": {}}
    top = [{"ms": 0.01, "op": "MatMul", "grid": [1, 2, 3], "block": [128, 1, 1],
            "template": "cuda.matmul_tc", "config": "TcConfig(" + "y" * 300 + ")"}] * 20
    for i in range(models):
        name = f"model{i}"
        for p in ("f16", "f32", "f16-tuned"):
            doc["models"].setdefault(name, {})[p] = {
                "device": "gpu", "status": "passed", "launches": 50, "graph": True,
                "check": {"status": "passed", "rel_error": 1e-3},
                "timing": {"device_ms": 0.5}, "profile": {"launches": 50, "total_ms": 0.6,
                                                          "top": top}}
        doc["peers"][name] = {"eager+graph f16": {"median_ms": 1.0},
                              "compile f16": {"median_ms": 0.625},
                              "eager+graph f32": {"median_ms": 0.5},
                              "eager f16": {"skipped": "out of time"}}
    return doc


def test_summary_fits_the_tail_and_ratios_follow_the_peers():
    doc = _doc()
    text = gpu_report.summary(doc)
    assert len(text) <= gpu_report.SUMMARY_LIMIT < 12_000
    r = gpu_report.ratios(doc)["model0"]
    assert r["f16"]["fastest"] == "compile f16" and r["f16"]["ratio"] == pytest.approx(0.8)
    assert r["f16"]["met"] is True and r["f32"]["ratio"] == pytest.approx(1.0)
    assert r["f32"]["met"] is False and r["f16-tuned"]["target"] == 0.8
    md = gpu_report.markdown(doc)
    assert md.count("| model0 |") == 3 and "skip" in md


def test_without_a_gpu_the_steps_that_need_none_still_run(tmp_path):
    """A real (non-dry) run on this GPU-less machine: the device step says why, the
    GPU steps are skipped with that reason, the runtime's fake-driver tests run."""
    out = tmp_path / "o"
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--only",
                           "runtime,templates,peers", "--budget", "120"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OUT=str(out), PYTHON=sys.executable))
    doc = json.loads((out / "gpu" / "results.json").read_text())
    steps = doc["steps"]
    if steps["device"]["status"] == "passed":
        pytest.skip("this machine has a usable GPU")
    assert steps["device"]["status"] == "unavailable" and doc["device"] == "none"
    assert steps["runtime"]["status"] == "passed", steps["runtime"]
    assert steps["templates"]["status"] == "skipped"
    assert steps["templates"]["reason"].startswith("no GPU (")
    assert set(steps) == {"device", "runtime", "templates", "peers"}
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== GPU check (gpu): no GPU:" in proc.stdout
    assert (out / "gpu" / "results.md").read_text().startswith("# GPU check (gpu)")


def test_a_dry_run_model_step_runs_on_the_emulator(tmp_path):
    out = tmp_path / "o"
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run",
                           "--only", "model_f16_bert_base,model_bf16_bert_base,peers"],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, OUT=str(out), PYTHON=sys.executable,
                                   HIDETC_GPU_WORK=str(tmp_path / "work")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads((out / "gpu" / "results.json").read_text())
    record = doc["models"]["bert_base"]["f16"]
    assert doc["device"] == "emulator" and record["device"] == "emulator"
    assert record["check"]["status"] == "passed" and record["check"]["rel_error"] < 1e-2
    assert record["timing"]["replays"] == 3 and record["graph"] is False
    top = record["profile"]["top"]
    assert len(top) == min(20, record["launches"]) and top[0]["ms"] >= top[-1]["ms"]
    assert {"grid", "block", "template", "config"} <= set(top[0])
    assert doc["steps"]["peers"]["status"] == "skipped"
    bf16 = doc["models"]["bert_base"]["bf16"]             # at the bf16 tolerance
    assert bf16["check"]["status"] == "passed" and bf16["check"]["rtol"] == 2e-2
    assert not (out / "gpu" / "work").exists()      # artifacts stay out of $OUT


@pytest.mark.slow
def test_the_dry_run_writes_every_step_and_model(tmp_path):
    out = tmp_path / "o"
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run"],
                          capture_output=True, text=True, timeout=480,
                          env=dict(os.environ, OUT=str(out), PYTHON=sys.executable,
                                   HIDETC_GPU_WORK=str(tmp_path / "work")))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads((out / "gpu" / "results.json").read_text())
    assert {"device", "primitives", "kernels", "templates", "runtime", "peers",
            "template_tests", "cuda_ops"} <= set(doc["steps"])
    assert all(doc["steps"][f"model_{p}_{m}"]["status"] == "passed"
               for p in ("f16", "bf16", "f32") for m in gpu_check.MODELS)
    assert set(doc["models"]) == set(gpu_check.MODELS)
    assert all(e["status"] in gpu_report.FINE for e in doc["steps"].values())
    assert len(proc.stdout.split("== GPU check")[-1]) < 12_000
