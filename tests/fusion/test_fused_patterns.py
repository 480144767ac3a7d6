"""Fused patterns end to end: each graph compiled for the cpu target (verified against
ONNX Runtime by the compile itself, then compared with the numpy reference) and for
the cuda target (cross-compiled by nvcc, every kernel run in the emulator), on awkward
shapes. The launch counts prove the fusion happened; the illegal cases prove it did
not where it must not. The graphs keep their NCHW layout (`layout="nchw"`), so both
targets fuse the same graph; the cpu's channels-last form of the ResNet block is
checked in tests/fusion/test_partition.py and tests/cli/test_cli_fusion.py."""
from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from helpers.fusion_graphs import (
    attention,
    const,
    illegal_fusions,
    model,
    prologue_patterns,
    resnet_block,
    vector_paths,
)

import hidetc
from hidetc.driver.verify import compare, run_onnxruntime
from hidetc.frontend.onnx.importer import import_model
from hidetc.graph.reference import run_graph

PATTERNS = {
    # name: (builder, launches after fusion)
    "resnet_block": (resnet_block, 4),
    "attention": (attention, 9),
    "prologues": (prologue_patterns, 5),
    "vector_paths": (vector_paths, 1),
    "illegal": (illegal_fusions, 4),
}
NVCC = shutil.which("nvcc")


def inputs_for(proto: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in proto.graph.input}


def compile_pattern(name, tmp_path, target):
    builder, launches = PATTERNS[name]
    proto = builder()
    path = tmp_path / f"{name}.onnx"
    onnx.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / f"out_{target}", target=target,
                                  arch="sm_80", layout="nchw")   # both targets: one graph
    assert len(result.manifest["kernels"]) == launches, \
        [k["op"] for k in result.manifest["kernels"]]
    return proto, path


@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_cpu(name, tmp_path):
    proto, path = compile_pattern(name, tmp_path, "cpu")
    inputs = inputs_for(proto)
    got = hidetc.load(tmp_path / "out_cpu").run(inputs)
    reference = run_graph(import_model(proto), inputs)
    for value, expected in reference.items():
        np.testing.assert_allclose(got[value], expected, rtol=1e-4, atol=1e-5, err_msg=value)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_pattern_cuda_emulated(name, tmp_path):
    proto, path = compile_pattern(name, tmp_path, "cuda")
    inputs = inputs_for(proto)
    got = hidetc.load(tmp_path / "out_cuda", emulate=True).run(inputs)
    report = compare(got, run_onnxruntime(path, inputs), rtol=1e-4)
    assert report["status"] == "passed", report


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_f16_nhwc_block_cuda_emulated(tmp_path):
    """--precision f16: the convolutions go NHWC on tensor cores; the first takes the
    input Cast and the NCHW -> NHWC Transpose as prologues (its cp.async loads
    expanded), the second the residual Add (of the first's NHWC output) and the Relu
    as epilogues; the global pool runs on the NHWC values (a ReduceMean) and takes the
    Flatten of the pooled [1, 1, 1, C] (its Transpose back moved no element:
    `fold_movement_chains` made the pair one Reshape); 1e-2 against ORT.
    (With the block input as the residual, its NHWC transpose is shared by the conv and
    the Add: a kernel of its own.)"""
    proto = resnet_block(c=16, hw=5, residual="r1")
    path = tmp_path / "block.onnx"
    onnx.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cuda", precision="f16",
                                  arch="sm_80")
    groups = {k["op"]: k["group"] for k in result.manifest["kernels"]}
    assert result.manifest["fusion"]["fallbacks"] == []
    convs = [k for k in result.manifest["kernels"] if k["op"] == "ConvNHWC"]
    prologues = [[op for _, op in k["group"]["prologues"]] for k in convs]
    assert prologues == [["Cast", "Transpose"], []]
    assert [op for _, op in convs[1]["group"]["epilogues"]] == ["Add", "Relu"]
    assert [op for _, op in groups["ReduceMean"]["epilogues"]] == ["Reshape"]
    assert groups["MatMul"]["epilogues"][-1][1] == "Cast"
    inputs = inputs_for(proto)
    got = hidetc.load(tmp_path / "out", emulate=True).run(inputs)
    report = compare(got, run_onnxruntime(path, inputs), rtol=1e-2)
    assert report["status"] == "passed", report


def _winograd_default(monkeypatch, m: int) -> None:
    """Make the Winograd conv (F(m, .)) the cpu conv template's default where it applies."""
    from hidetc.schedules.common.conv_geometry import conv_geometry
    from hidetc.schedules.cpu import conv as cpu_conv
    from hidetc.schedules.cpu import winograd
    base = cpu_conv.ConvTemplate.default

    def default(self, task, target):
        if winograd.supports(conv_geometry(task)):
            return winograd.WinogradConfig(m, 4, 32, 64, 192, 256)
        return base(self, task, target)
    monkeypatch.setattr(cpu_conv.ConvTemplate, "default", default)


@pytest.mark.parametrize("pads", [[0, 0, 0, 0], [1, 2, 1, 2]])
def test_winograd_conv_with_a_prologue_cpu(pads, tmp_path, monkeypatch):
    """A Winograd conv (F(4x4,3x3)) whose input is the Relu of another conv's output
    that is also a graph output (so the Relu is the second conv's prologue, grafted into
    its loads: the input transform's vector loads of the input itself without pads, the
    padded copy's with them), Relu and the NCHW transpose after; 1e-4 against ONNX
    Runtime."""
    _winograd_default(monkeypatch, 4)
    nodes = [("Conv", ["x", "w0"], ["c0"], {"pads": [1, 1, 1, 1]}),
             ("Relu", ["c0"], ["r0"], {}),
             ("Conv", ["r0", "w1", "b1"], ["c1"], {"pads": pads}),
             ("Relu", ["c1"], ["r1"], {})]
    proto = model(nodes, {"x": [1, 16, 13, 14]}, ["c0", "r1"],
                  {"w0": const((16, 16, 3, 3)), "w1": const((24, 16, 3, 3)),
                   "b1": const((24,))})
    path = tmp_path / "pro.onnx"
    onnx.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu", tune=False)
    convs = [k for k in result.manifest["kernels"] if k["op"] == "ConvNHWC"]
    assert all(k["config"].startswith("WinogradConfig(m=4,") for k in convs), convs
    assert [op for _, op in convs[1]["group"]["prologues"]] == ["Relu"]
    assert [op for _, op in convs[1]["group"]["epilogues"]][0] == "Relu"
    inputs = inputs_for(proto)
    got = hidetc.load(tmp_path / "out").run(inputs)
    report = compare(got, run_onnxruntime(path, inputs), rtol=1e-4)
    assert report["status"] == "passed", report


@pytest.mark.parametrize("m,residual", [(2, "x"), (4, "r1")])
def test_winograd_block_cpu(m, residual, tmp_path, monkeypatch):
    """Both 3x3 convs of a residual block as Winograd F(m x m, 3x3) (the template's
    default made so; no tuning): the first takes the Relu, the second the residual Add
    (of the block input, or of the first conv's output) and the Relu as epilogues on its
    output transform's stores; 1e-4 against ONNX Runtime. The 14x14 map leaves a
    partial last tile row and column for m = 4."""
    _winograd_default(monkeypatch, m)
    proto = resnet_block(c=24, hw=14, residual=residual)
    path = tmp_path / "block.onnx"
    onnx.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu", tune=False)
    convs = [k for k in result.manifest["kernels"] if k["op"] == "ConvNHWC"]
    assert [k["config"].startswith(f"WinogradConfig(m={m},") for k in convs] == [True, True]
    assert [op for _, op in convs[1]["group"]["epilogues"]] == ["Add", "Relu"]
    assert result.manifest["fusion"]["fallbacks"] == []
    inputs = inputs_for(proto)
    got = hidetc.load(tmp_path / "out").run(inputs)
    report = compare(got, run_onnxruntime(path, inputs), rtol=1e-4)
    assert report["status"] == "passed", report
