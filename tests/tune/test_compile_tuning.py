"""Tuning through `hidetc compile`: measured once and recorded, reused by the next
compile, two compiles sharing one store at the same time, and a GPU-less cross-compile
for cuda taking its configs from imported records."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import onnx
import pytest
from click.testing import CliRunner
from helpers.fusion_graphs import graph_of, resnet_block

import hidetc
from hidetc.driver.context import CompileContext
from hidetc.driver.tune.records import CandidateResult, RecordStore
from hidetc.driver.tune.search import candidates, tune
from hidetc.target import cuda_target
from hidetc.tools.cli import main


@pytest.fixture
def block(tmp_path):
    path = tmp_path / "block.onnx"
    onnx.save(resnet_block(c=8, hw=5), path)
    return path


def test_tuned_then_reused(block, tmp_path):
    records = tmp_path / "records.sqlite"
    first = hidetc.compile_model(block, tmp_path / "a", tune=True, space=1, records=str(records))
    tuning = first.manifest["tuning"]
    assert tuning["enabled"] and tuning["tuned"] == 2 and tuning["candidates"] == 16
    templated = [k for k in first.manifest["kernels"] if k["template"] != "rule"]
    assert templated and all(k["tuning"] == "tuned" for k in templated)
    assert first.manifest["verification"]["status"] == "passed"
    second = hidetc.compile_model(block, tmp_path / "b", tune=True, records=str(records))
    assert second.manifest["tuning"]["from_records"] == 2
    assert second.manifest["tuning"]["candidates"] == 0
    assert [k["config"] for k in second.manifest["kernels"]] == \
        [k["config"] for k in first.manifest["kernels"]]


def test_two_compiles_share_one_store(block, tmp_path):
    records = tmp_path / "shared.sqlite"
    env = {**os.environ, "HIDETC_TUNE": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "hidetc.tools.cli", "compile", str(block),
                               "-o",
                               str(tmp_path / f"out{i}"), "--tune", "--space", "1",
                               "--records", str(records), "--no-verify"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    with RecordStore(records) as store:
        entries = store.entries()
    assert len(entries) == 2 and all(e["winner"] for e in entries)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_cross_compile_uses_imported_records(block, tmp_path):
    """Records 'measured on a GPU machine' (winners chosen by a stand-in measurement,
    the last config of each short list) exported, imported here, and used by a
    cross-compile for sm_90 without a GPU."""
    graph = graph_of(resnet_block(c=8, hw=5))

    def fake_measure(task, template, configs, *, target, progress=None):
        n = len(configs)
        return [CandidateResult(repr(c), float(n - i), None) for i, c in enumerate(configs)]

    target = cuda_target("sm_90")
    ctx = CompileContext.for_machine(target)
    selection = ctx.select(graph)
    with RecordStore(tmp_path / "gpu.sqlite") as gpu:
        # what a compile on the GPU machine records: its device and toolchain
        tune(selection, ctx.backend, target, tune=True, level=1, arch="sm_90", records=gpu,
             device="NVIDIA H200", toolchain="nvcc other", measure=fake_measure)
        gpu.export(tmp_path / "winners.jsonl")
    local = tmp_path / "local.sqlite"
    result = CliRunner().invoke(main, ["records", "import", str(tmp_path / "winners.jsonl"),
                                       "--records", str(local)])
    assert result.exit_code == 0, result.output
    out = hidetc.compile_model(block, tmp_path / "cuda", target="cuda", arch="sm_90",
                               records=str(local), verify=False)
    templated = [k for k in out.manifest["kernels"] if k["template"] != "rule"]
    assert templated and all(k["tuning"] == "imported" for k in templated)
    expected = {repr(candidates(template, task, target, 1)[-1])
                for task, template, _ in selection.templated()}
    assert {k["config"] for k in templated} == expected


def test_direct_conv_from_records_compiles_fused_and_verified(block, tmp_path):
    """Records that pick the direct convolution for every conv of a ResNet block (a
    full-space tuning whose stand-in measurement ranks its configs first): the plan
    packs the weights as W^T panels, the epilogues (Add, Relu) graft onto its
    transposed store, and the artifact passes verification against ONNX Runtime."""
    from hidetc.schedules.cpu.conv_direct import DirectConfig

    def fake_measure(task, template, configs, *, target, progress=None):
        return [CandidateResult(repr(c), 1.0 + i + (0 if isinstance(c, DirectConfig) else 1000))
                for i, c in enumerate(configs)]

    records = tmp_path / "records.sqlite"
    hidetc.compile_model(block, tmp_path / "tuned", target="cpu", records=str(records),
                         layout="nchw", tune=True, space=2, measure=fake_measure,
                         verify=False)
    out = hidetc.compile_model(block, tmp_path / "out", target="cpu", records=str(records),
                               layout="nchw")
    convs = [k for k in out.manifest["kernels"] if k["op"] == "Conv"]
    assert convs and all(k["config"].startswith("DirectConfig") for k in convs), convs
    assert all(".packed_t" in k["args"][1] for k in convs)
    assert any(k["group"]["epilogues"] for k in convs)
    assert out.manifest["verification"]["status"] == "passed"
