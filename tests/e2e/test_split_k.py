"""Split-K end to end on the cuda target (f16, cross-compiled for sm_80, run in the
emulator): long-K MatMuls and a deep 3x3 convolution whose tiles alone would fill few
of the A100's SMs get split K from the cost model; their grafted epilogues (bias, GELU's
erf chain, a residual Add, ReLU) run in the block that reduces the partial sums; the
workspace and the arrival counters get arena memory (one zeroed region shared by every
split launch); the outputs match ONNX Runtime within the f16 tolerance, and two runs
give bit-identical outputs (the partial sums are added in split order, whichever block
arrives last). `hidetc inspect --json` reports each launch's cost-model facts."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from helpers.fusion_graphs import target_graph
from helpers.split_k_model import split_k_model

import hidetc
import models
from hidetc.backends.codegen.cuda import dynamic_shared_bytes
from hidetc.driver.build_cuda import cuda_section
from hidetc.driver.config import TOLERANCES
from hidetc.driver.context import plan_graph
from hidetc.driver.plan import ZEROED_SCRATCH
from hidetc.driver.tune.search import Choice
from hidetc.driver.verify import compare, run_onnxruntime
from hidetc.schedules.cuda import matmul_tc
from hidetc.target import KNOWN_GPUS
from hidetc.tools.cli import main as cli

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


def test_split_k_with_grafted_epilogues_emulated(tmp_path):
    proto = split_k_model()
    path = tmp_path / "model.onnx"
    models.save(proto, path)
    out = tmp_path / "out"
    result = hidetc.compile_model(path, out, target="cuda", precision="f16", gpu="a100")
    manifest = result.manifest
    split = [k for k in manifest["kernels"] if "splits=1)" not in (k.get("config") or "")
             and k.get("template") in ("cuda.matmul_tc", "cuda.conv_tc")]
    assert {k["op"] for k in split} >= {"MatMul"}, [k.get("config") for k in
                                                     manifest["kernels"]]
    assert any(k["group"]["epilogues"] for k in split)      # an epilogue rides on a split
    offsets = manifest["memory"]["offsets"]
    assert ZEROED_SCRATCH in offsets
    for kernel in split:    # the workspace and the counters are its last two arguments
        assert kernel["args"][-1] == ZEROED_SCRATCH and kernel["args"][-2] in offsets
    # the arrival protocol's one fence pair, both in thread 0 (no fence per thread)
    source = "".join(p.read_text() for p in (out / "kernels" / "src").glob("*.cu"))
    for kernel in split:
        body = source[source.index(f"{kernel['name']}("):]
        body = body[:body.index("\n}\n")]
        assert body.count("__threadfence()") == 2, kernel["name"]
    model = hidetc.load(out, emulate=True, sanitize=True)     # (blocks both ways round)
    inputs = models.sample_inputs(proto, seed=3)
    first = model.run(inputs)
    report = compare(first, run_onnxruntime(path, inputs), rtol=TOLERANCES["f16"])
    assert report["status"] == "passed", report
    again = model.run(inputs)
    for name in first:
        assert np.array_equal(first[name], again[name]), name

    shown = CliRunner().invoke(cli, ["inspect", str(out), "--json"])
    assert shown.exit_code == 0, shown.output
    kernels = json.loads(shown.output)["kernels"]
    for kernel in kernels:
        assert kernel["estimate_us"] > 0 and kernel["bytes"] > 0 and kernel["waves"] >= 1
        assert kernel["blocks"] >= 1 and kernel["blocks_per_sm"] >= 1
    text = CliRunner().invoke(cli, ["inspect", str(out)])
    assert text.exit_code == 0 and "cost model:" in text.output and "wave(s)" in text.output


def test_a_tuned_dynamic_shared_config_reaches_the_manifest(tmp_path):
    """A config past 48 KiB of shared memory (as tuning on a GPU may pick): its kernel
    declares dynamic shared memory and the manifest's launch passes that many bytes
    (the kernels themselves run in the emulator in tests/schedules/test_cuda_*_tc.py)."""
    target = KNOWN_GPUS["h200"]
    graph = target_graph(split_k_model(), target, precision="f16")
    plan = plan_graph(graph, target)
    deep = matmul_tc.TcConfig(128, 64, 64, 4, 1, 4)             # 96 KiB, 4 stages
    assert deep in matmul_tc.TEMPLATE.space(None, target) and deep.shared_bytes > 48 * 1024
    choices = {task: Choice(matmul_tc.TEMPLATE, deep, "tuned")
               for task in plan.tasks.values() if task.op == "MatMul"}
    plan = plan_graph(graph, target, choices=choices)
    entries = {name: type("E", (), {"offset": 0})() for name in plan.weights}
    section = cuda_section(plan, entries, {n: "unit0" for n in plan.functions}, [], ["sm_90"])
    shared = {launch["kernel"]: launch["shared_bytes"] for launch in section["launches"]}
    matmuls = [r.kernel for r in plan.launches if r.op == "MatMul"]
    assert matmuls and all(shared[k] == deep.shared_bytes for k in matmuls)
    assert all(shared[k] == dynamic_shared_bytes(plan.functions[k]) for k in shared)
