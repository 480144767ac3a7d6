"""`hidetc inspect` shows the fusion groups and each kernel's template and config;
`--no-fuse` gives one launch per node; `hidetc inspect --space` lists the templates'
spaces within the budget."""
from __future__ import annotations

import json

import onnx
from click.testing import CliRunner
from helpers.fusion_graphs import resnet_block

from hidetc.schedules.template import MAX_SPACE
from hidetc.tools.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_inspect_lists_groups_and_configs(tmp_path):
    path = tmp_path / "block.onnx"
    onnx.save(resnet_block(), path)
    assert invoke("compile", path, "-o", tmp_path / "out", "--layout", "nchw").exit_code == 0
    text = invoke("inspect", tmp_path / "out").output
    assert "9 graph nodes in 4 groups (4 with fused neighbours)" in text
    assert "Conv [* > Add, Relu]" in text and "GlobalAveragePool [* > Reshape]" in text
    assert "cpu.conv: GemmConfig(" in text and "cpu.matmul: GemmConfig(" in text
    doc = json.loads(invoke("inspect", tmp_path / "out", "--json").output)
    conv = doc["kernels"][1]
    assert conv["group"]["epilogues"][0][1] == "Add" and conv["template"] == "cpu.conv"
    assert doc["fusion"]["fallbacks"] == []

    result = invoke("compile", path, "-o", tmp_path / "nhwc")     # --layout auto
    assert result.exit_code == 0, result.output
    text = invoke("inspect", tmp_path / "nhwc").output
    assert "ConvNHWC [* > Add, Relu]" in text and "cpu.conv: DirectConfig(" in text
    assert "ReduceMean [* > Reshape]" in text     # the NHWC global pool (its transpose folded)

    result = invoke("compile", path, "-o", tmp_path / "unfused", "--no-fuse", "--layout", "nchw")
    assert result.exit_code == 0, result.output
    doc = json.loads(invoke("inspect", tmp_path / "unfused", "--json").output)
    assert len(doc["kernels"]) == 9 and doc["fusion"]["groups"] == 9


def test_inspect_space():
    result = invoke("inspect", "--space")
    assert result.exit_code == 0, result.output
    assert "cpu.matmul" in result.output and "cuda.matmul_tc" in result.output
    rows = json.loads(invoke("inspect", "--space", "--json", "--target", "cuda").output)
    assert rows and all(r["target"] == "cuda" and r["configs"] <= MAX_SPACE for r in rows)
    assert {"f32", "f16"} <= {r["precision"] for r in rows}


def test_inspect_needs_an_artifact_or_space():
    result = invoke("inspect")
    assert result.exit_code == 2 and "--space" in result.output


def test_half_precision_tensors_compile_on_the_cpu(tmp_path):
    """float16 tensors (here in a fused group) compile for the cpu target and verify."""
    from onnx import TensorProto, helper
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT, name="cast")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "half.onnx")
    result = invoke("compile", tmp_path / "half.onnx", "-o", tmp_path / "out", "--target", "cpu")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out").exists()
