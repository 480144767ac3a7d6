"""The compile as one pipeline (issue 35): the graph is partitioned and each anchor task's
template chosen ONCE per compile (tuning and planning read the selection), the plan is a
list of launch records from which the manifest's kernel entries are derived, and the
decisions about this host (tuning, verification) are made once, from the config."""
from __future__ import annotations

from collections import Counter

import pytest
from helpers.fusion_graphs import resnet_block

import hidetc
import models
from hidetc.backends.runtime.artifact import read_manifest
from hidetc.driver import select as select_module
from hidetc.driver.backend import BACKENDS
from hidetc.driver.config import CompileConfig
from hidetc.driver.context import CompileContext, environment_options
from hidetc.driver.tune.records import CandidateResult
from hidetc.errors import ConfigError
from hidetc.frontend.onnx.importer import load_model


@pytest.fixture
def counted(monkeypatch):
    """Counts partitions and template choices during a compile."""
    counts: Counter = Counter()
    real_partition = select_module.partition
    monkeypatch.setattr(select_module, "partition",
                        lambda *a, **k: counts.update(["partition"]) or real_partition(*a, **k))
    for backend in BACKENDS.values():
        real = backend.schedules.anchor_template

        def choose(task, weights, target, real=real):
            counts.update([("template", task)])
            return real(task, weights, target)
        monkeypatch.setattr(backend.schedules, "anchor_template", choose)
    return counts


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_partition_and_selection_run_once(tmp_path, counted, target):
    path = tmp_path / "block.onnx"
    models.save(resnet_block(c=8, hw=5), path)

    def measure(task, template, configs, *, target, progress=None):
        counted.update(["measured"])
        return [CandidateResult(repr(c), 1.0 + i) for i, c in enumerate(configs)]
    options = {"tune": True, "space": 0, "measure": measure} if target == "cpu" else {}
    result = hidetc.compile_model(path, tmp_path / "out", target=target,
                                  records=str(tmp_path / "r.sqlite"), **options)
    assert counted["partition"] == 1
    chosen = [k for k in counted if isinstance(k, tuple)]
    assert chosen and all(counted[k] == 1 for k in chosen)     # one choice per task
    if target == "cpu":
        assert counted["measured"] == len({k["task"] for k in result.manifest["kernels"]
                                           if k["template"] != "rule"})
    assert result.manifest["fusion"]["groups"] == len(result.manifest["kernels"])


def test_the_plan_is_its_launch_records(tmp_path):
    path = tmp_path / "block.onnx"
    models.save(resnet_block(c=8, hw=5), path)
    ctx = CompileContext.create(CompileConfig(target="cpu", tune=False, verify=False))
    graph = ctx.optimize(load_model(path))
    plan = ctx.plan(ctx.select(graph))
    values = {v for r in plan.launches for v in r.values}
    # every value a launch reads or writes lives somewhere: the arena, an input, an
    # output, the weights
    for record in plan.launches:
        assert len(record.values) == len(record.args) == len(record.function.params)
        for value, arg in zip(record.values, record.args):
            assert arg.space in ("arena", "input", "output", "weights")
            if arg.space == "arena":
                assert plan.memory.offsets[value] == arg.index
    assert set(plan.graph.outputs) <= values
    assert len(plan.functions) <= len(plan.launches)
    # the artifact's manifest, as written to disk, holds those launches: each entry is
    # its record's (the build adds its resources)
    hidetc.compile_model(path, tmp_path / "out", target="cpu", tune=False, verify=False)
    kernels = read_manifest(tmp_path / "out")["kernels"]
    assert len(kernels) == len(plan.launches)
    for entry, record in zip(kernels, plan.launches):
        derived = record.manifest_entry(plan.graph)
        assert entry["name"] == record.kernel and entry["args"] == list(record.values)
        assert entry["flops"] == record.facts["flops"] and entry["task"]
        assert {k: entry[k] for k in derived} == derived


def test_decisions_come_from_the_config():
    here = CompileContext.create(CompileConfig(target="cpu"))
    assert here.present and here.tunes and here.skip_verify is None
    assert here.level == BACKENDS["cpu"].default_space
    off = CompileContext.create(CompileConfig(target="cpu", tune=False, verify=False))
    assert not off.tunes and off.skip_verify == "--no-verify"
    away = CompileContext.create(CompileConfig(target="cpu", cpu_cores=here.machine.cores + 7))
    assert not away.present and not away.tunes                    # a cross-compile
    with pytest.raises(ConfigError, match="cannot be measured"):
        CompileContext.create(CompileConfig(target="cpu", cpu_cores=99, tune=True))
    assert environment_options({"HIDETC_TUNE": "0", "HIDETC_CPU_ISA": "avx2"}) == \
        {"tune": False, "cpu_isa": "avx2"}
    assert environment_options({"HIDETC_CPU_ISA": "auto"}) == {}
    with pytest.raises(ConfigError, match="HIDETC_CPU_ISA='sse9'"):   # named as set
        environment_options({"HIDETC_CPU_ISA": "sse9"})
