"""`hidetc farm` and `hidetc compile --cluster` without a Ray cluster (the farm's own
tests, on local Ray clusters, are tests/farm: `make test-farm`): the jobs file's parsing
and its one-line errors, a local farm run of tiny jobs (artifacts, table, JSON report),
a run through a stand-in farm (the farm protocol in this process), `farm resources`, and
--cluster without Ray."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers.cli import assert_one_line_error, invoke, relu_model
from onnx import TensorProto, helper

from hidetc.backends.runtime.artifact import read_manifest
from hidetc.driver.backend import backend_of
from hidetc.driver.tune import ray_farm
from hidetc.driver.tune.measure import measure_candidates
from hidetc.errors import ConfigError


def _mlp(batch: int | str = 2) -> onnx.ModelProto:
    """y = relu(x @ w): one MatMul anchor (a templated task to tune)."""
    w = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="/mm"),
             helper.make_node("Relu", ["h"], ["y"], name="/relu")]
    graph = helper.make_graph(nodes, "mlp", [x], [y], [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.fixture
def models(tmp_path):
    (tmp_path / "models").mkdir()
    onnx.save(relu_model([2, 3]), tmp_path / "models" / "relu.onnx")
    onnx.save(_mlp(), tmp_path / "models" / "mlp.onnx")
    return tmp_path


def _jobs(root: Path, text: str) -> Path:
    path = root / "jobs.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- the jobs file


@pytest.mark.parametrize("text, fragments", [
    ("jobs:\n  - {model: models/relu.onnx, out: o, bogus_opt: 1}\n",
     ["jobs.yaml: job 1: bogus_opt: unknown option"]),
    ("jobs:\n  - {model: models/relu.onnx, out: a}\n  - {out: b, target: cpu}\n",
     ["jobs.yaml: job 2: model: missing"]),
    ("jobs:\n  - {model: models/relu.onnx}\n", ["job 1: out: missing"]),
    ("jobs:\n  - {model: models/nope.onnx, out: o}\n", ["job 1: model:", "nope.onnx",
                                                        "no such file"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o, space: 5}\n",
     ["jobs.yaml: job 1: space: Invalid value for '--space'"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o, target: tpu}\n",
     ["job 1: target: Invalid value for '--target'", "'tpu'"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o, cpu-cores: 0}\n",
     ["job 1: cpu-cores: Invalid value for '--cpu-cores'"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o, tune: 3}\n",
     ["job 1: tune: expected true or false"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o, precision: [f32, f16]}\n",
     ["job 1: precision: expected one value"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o, shape: [x=2xq]}\n",
     ["job 1: --shape 'x=2xq': expected NAME="]),
    ("jobs:\n  - {model: models/relu.onnx, out: o, records: r.sqlite}\n",
     ["job 1: records: all jobs share one record store"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o, cluster: auto}\n",
     ["job 1: cluster: give --cluster to `hidetc farm run`"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o, config: nope.yaml}\n",
     ["job 1: config:", "nope.yaml: config file not found"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o}\n  - {model: models/relu.onnx, out: ./o}\n",
     ["job 2: out: ./o is job 1's too"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o, tune: true, no-tune: true}\n",
     ["job 1: no-tune: the same option as tune"]),
    ("jobs:\n  - models/relu.onnx\n", ["job 1: expected a mapping"]),
    ("jobs: []\n", ["jobs.yaml: expected `jobs:` with a list of jobs"]),
    ("models: [a.onnx]\n", ["jobs.yaml: expected `jobs:`"]),
    ("jobs:\n  - {model: models/relu.onnx, out: o}\nextra: 1\n", ["unknown key(s) extra"]),
    ("jobs: [\n", ["jobs.yaml: not valid YAML"]),
])
def test_a_malformed_jobs_file_is_one_line_naming_the_file_job_and_key(models, text,
                                                                        fragments):
    result = invoke("farm", "run", _jobs(models, text))
    assert_one_line_error(result, *fragments)
    assert not (models / "o").exists()


def test_a_missing_jobs_file_is_one_line(tmp_path):
    assert_one_line_error(invoke("farm", tmp_path / "none.yaml"), "jobs file not found")


def test_every_job_is_checked_before_the_first_runs(models):
    text = ("jobs:\n  - {model: models/relu.onnx, out: first, tune: false}\n"
            "  - {model: models/relu.onnx, out: second, layout: diagonal}\n")
    assert_one_line_error(invoke("farm", "run", _jobs(models, text)),
                          "job 2: layout: Invalid value for '--layout'")
    assert not (models / "first").exists()


def test_the_jobs_options_are_the_compile_commands():
    from hidetc.tools.farm import _option_args
    base = Path("/jobs")
    assert _option_args("f", base, "tune", False)[1] == ["--no-tune"]
    assert _option_args("f", base, "tune", True)[1] == ["--tune"]
    assert _option_args("f", base, "no_tune", True)[1] == ["--no-tune"]
    assert _option_args("f", base, "verify", False)[1] == ["--no-verify"]
    assert _option_args("f", base, "verify", True)[1] == []
    assert _option_args("f", base, "no-fuse", True)[1] == ["--no-fuse"]
    assert _option_args("f", base, "cpu_isa", "avx2")[1] == ["--cpu-isa=avx2"]
    assert _option_args("f", base, "shape", ["x=1x3", "y=2"])[1] == \
        ["--shape=x=1x3", "--shape=y=2"]
    assert _option_args("f", base, "dim_opt", {"n": "16,64"})[1] == ["--dim-opt=n=16,64"]
    assert _option_args("f", base, "sample", "in.npz")[1] == ["--sample=/jobs/in.npz"]
    assert _option_args("f", base, "config", "fast")[1] == ["--config=fast"]
    assert _option_args("f", base, "config", "my.yaml")[1] == ["--config=/jobs/my.yaml"]
    assert _option_args("f", base, "seed", -3)[1] == ["--seed=-3"]


def test_the_options_become_the_compile_overrides(models):
    from hidetc.tools.farm import load_jobs
    path = _jobs(models, "jobs:\n  - model: models/relu.onnx\n    out: out/a\n"
                         "    target: cpu\n    space: 0\n    tune: false\n    verify: false\n"
                         "    shape: [x=2x3]\n    dim-opt: {n: 16}\n")
    [job] = load_jobs(path, records="r.sqlite")
    assert (job.index, job.model, job.out) == (1, models / "models/relu.onnx",
                                               models / "out/a")
    o = job.overrides
    assert (o["target"], o["space"], o["tune"], o["verify"], o["records"]) == \
        ("cpu", 0, False, False, "r.sqlite")
    assert o["shapes"] == {"x": [2, 3]} and o["dim_opts"] == {"n": [16]}
    assert (job.target, job.precision) == ("cpu", "f32")


# ---------------------------------------------------------------- a local farm


def test_a_local_farm_compiles_every_job_and_reports(models):
    text = ("jobs:\n"
            "  - {model: models/relu.onnx, out: out/relu-cpu, target: cpu, tune: false}\n"
            "  - model: models/mlp.onnx\n    out: out/mlp-cpu\n    target: cpu\n"
            "    precision: f32\n    tune: true\n    space: 0\n")
    report = models / "report.json"
    result = invoke("farm", "run", _jobs(models, text), "--records",
                    models / "records.sqlite", "--report", report)
    assert result.exit_code == 0, (result.output, result.exception)
    for out in ("relu-cpu", "mlp-cpu"):
        assert read_manifest(models / "out" / out)["verification"]["status"] == "passed"
    table = result.stdout.splitlines()
    assert table[0].split() == ["job", "model", "target/precision", "status", "seconds",
                                "measured", "failures", "nodes"]
    assert table[1].split()[:4] == ["1", "models/relu.onnx", "cpu/f32", "ok"]
    row = table[2].split()
    assert row[:4] == ["2", "models/mlp.onnx", "cpu/f32", "ok"]
    assert row[5:] == ["1", "0", "local"]       # the default config, measured here
    assert "farm: job 2/2" in result.stderr      # progress
    doc = json.loads(report.read_text())
    assert doc["cluster"] is None and doc["records"] == str(models / "records.sqlite")
    first, second = doc["jobs"]
    assert (first["status"], first["error"], first["options"]) == \
        ("ok", None, {"target": "cpu", "tune": False})
    assert first["measured_on"] == [] and first["tuning"]["tasks"] == 0
    assert second["tuning"]["tuned"] == 1 and second["tuning"]["candidates"] == 1
    assert second["measured_on"] == ["local"]
    manifest = read_manifest(models / "out" / "mlp-cpu")
    assert [(w["op"], w["template"], w["config"]) for w in second["winners"]] == \
        [(k["op"], k.get("template"), k.get("config")) for k in manifest["kernels"]]
    assert any(w["op"] == "MatMul" and w["config"] for w in second["winners"])
    assert doc["totals"] == {**doc["totals"], "jobs": 2, "ok": 2, "failed": 0,
                             "candidates": 1}

    # run again: the records have it all (a restarted farm resumes from them)
    again = invoke("farm", _jobs(models, text), "--records", models / "records.sqlite")
    assert again.exit_code == 0, (again.output, again.exception)
    assert again.stdout.splitlines()[2].split()[5:] == ["0", "0", "-"]


def test_a_failing_job_is_reported_and_the_farm_goes_on(models):
    text = ("jobs:\n"
            "  - {model: models/mlp.onnx, out: out/f16, target: cpu, precision: f16}\n"
            "  - {model: models/relu.onnx, out: out/relu, target: cpu, tune: false}\n")
    report = models / "report.json"
    result = invoke("farm", "run", _jobs(models, text), "--records", models / "r.sqlite",
                    "--report", report)
    assert result.exit_code == 1, (result.output, result.exception)
    assert "f16 precision needs the cuda target" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "hidetc: error: job 1/2 (models/mlp.onnx): f16 precision")
    rows = [line.split() for line in result.stdout.splitlines()[1:3]]
    assert rows[0][:4] == ["1", "models/mlp.onnx", "cpu/f16", "failed"]
    assert rows[1][:4] == ["2", "models/relu.onnx", "cpu/f32", "ok"]
    assert (models / "out" / "relu" / "manifest.yaml").is_file()
    doc = json.loads(report.read_text())
    assert doc["jobs"][0]["status"] == "failed" and "f16" in doc["jobs"][0]["error"]
    assert doc["jobs"][0]["tuning"] is None and doc["jobs"][0]["winners"] == []
    assert (doc["totals"]["ok"], doc["totals"]["failed"]) == (1, 1)


# ---------------------------------------------------------------- through a farm


class StandInFarm(ray_farm.RayFarm):
    """The farm protocol (`measure_all`) in this process, as one node "node-a": what
    the CLI does with a farm, without Ray."""

    def record_facts(self, target, present=False):
        return backend_of(target).record_facts(target, True)

    def measure_all(self, jobs, *, target, commit, progress=None):
        backend = backend_of(target)
        arch, _ = backend.record_facts(target, True)
        total, done = sum(len(j.configs) for j in jobs), 0
        for n, job in enumerate(jobs):
            results = measure_candidates(job.task, job.template, job.configs, target=target,
                                         measurer=backend.measure, arch=arch,
                                         budget_rtol=job.budget)
            self.stats.count("node-a", "chunks")
            self.stats.count("node-a", "measured", sum(r.error is None for r in results))
            self.stats.count("node-a", "failed", sum(r.error is not None for r in results))
            self.stats.where.setdefault(job.key, set()).add("node-a")
            commit(n, results)
            done += len(job.configs)
            if progress:
                progress(job.label, done, total)


@pytest.fixture
def stand_in(monkeypatch):
    addresses = []
    monkeypatch.setattr(ray_farm, "connect", addresses.append)
    monkeypatch.setattr(ray_farm, "RayFarm", StandInFarm)
    return addresses


def test_compile_with_a_cluster_tunes_through_the_farm(models, stand_in):
    out = models / "out"
    result = invoke("compile", models / "models" / "mlp.onnx", "-o", out, "--target", "cpu",
                    "--space", "0", "--records", models / "r.sqlite", "--cluster",
                    "ray://head:10001")
    assert result.exit_code == 0, (result.output, result.exception)
    assert stand_in == ["ray://head:10001"]
    assert "  farm: 1 measuring node: node-a 1 measured, 0 failed (1 chunks)" in \
        result.stdout.splitlines()
    assert read_manifest(out)["tuning"]["tuned"] == 1     # tuning on (HIDETC_TUNE=0 here)


def test_a_range_compile_tunes_through_the_farm(models, stand_in):
    """A compile for a range of sizes also measures its dispatch table's missing
    configs one task at a time (the farm's plain measurer form)."""
    out = models / "out"
    onnx.save(_mlp("n"), models / "models" / "mlp_n.onnx")
    result = invoke("compile", models / "models" / "mlp_n.onnx", "-o", out, "--target",
                    "cpu", "--space", "1", "--records", models / "r.sqlite", "--dim",
                    "n=1..16", "--cluster", "auto")
    assert result.exit_code == 0, (result.output, result.exception)
    assert read_manifest(out)["dynamic"]["variants"]


def test_a_farm_on_a_cluster_reports_where_each_job_was_measured(models, stand_in):
    text = ("jobs:\n"
            "  - {model: models/mlp.onnx, out: out/mlp, target: cpu, space: 0}\n"
            "  - {model: models/relu.onnx, out: out/relu, target: cpu}\n")
    report = models / "report.json"
    result = invoke("farm", _jobs(models, text), "--cluster", "auto", "--records",
                    models / "r.sqlite", "--report", report)
    assert result.exit_code == 0, (result.output, result.exception)
    assert stand_in == ["auto"]
    lines = result.stdout.splitlines()
    assert lines[1].split()[5:] == ["1", "0", "1"] and lines[2].split()[5:] == ["0", "0", "0"]
    assert "farm: 1 measuring node: node-a 1 measured, 0 failed (1 chunks)" in lines
    doc = json.loads(report.read_text())
    assert doc["cluster"] == "auto"
    assert doc["jobs"][0]["measured_on"] == ["node-a"] and doc["jobs"][1]["measured_on"] == []
    counts = {"chunks": 1, "measured": 1, "failed": 0}
    for nodes in (doc["jobs"][0]["nodes"], doc["totals"]["nodes"]):
        assert list(nodes) == ["node-a"] and nodes["node-a"] == {**nodes["node-a"], **counts}
    assert doc["jobs"][1]["nodes"] == {}
    assert doc["totals"]["lost"] == 0


# ---------------------------------------------------------------- --cluster without Ray


def _no_ray():
    raise ConfigError("--cluster needs Ray: pip install 'hidetc[ray]'")


def test_compile_with_a_cluster_and_no_ray_is_one_line(models, monkeypatch):
    monkeypatch.setattr(ray_farm, "import_ray", _no_ray)
    result = invoke("compile", models / "models" / "relu.onnx", "-o", models / "out",
                    "--cluster", "auto")
    assert_one_line_error(result, "--cluster needs Ray: pip install 'hidetc[ray]'")
    assert not (models / "out").exists()


def test_without_the_ray_module_cluster_is_one_line(models, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)        # `import ray` fails
    result = invoke("farm", _jobs(models, "jobs:\n  - {model: models/relu.onnx, out: o}\n"),
                    "--cluster", "ray://head:10001")
    assert_one_line_error(result, "--cluster needs Ray: pip install 'hidetc[ray]'")


def test_cluster_with_no_tune_is_one_line(models):
    result = invoke("compile", models / "models" / "relu.onnx", "-o", models / "out",
                    "--cluster", "auto", "--no-tune")
    assert_one_line_error(result, "--cluster tunes on the cluster", "--no-tune")


# ---------------------------------------------------------------- farm resources


def test_farm_resources_prints_this_machines_resource():
    result = invoke("farm", "resources")
    assert result.exit_code == 0, (result.output, result.exception)
    resources = json.loads(result.stdout)
    [(name, count)] = resources.items()
    assert name.startswith("hidetc-machine-") and count == 1
    assert json.loads(invoke("farm", "resources", "--target", "cpu").stdout) == resources


def test_farm_resources_refuses_a_machine_this_is_not():
    result = invoke("farm", "resources", "--target", "cpu", "--cpu-cores", "999")
    assert_one_line_error(result, "999 cores", "cannot measure for it")
