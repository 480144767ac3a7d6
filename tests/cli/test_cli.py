"""The command line: compile / run / inspect on a small model, and every bad input the
issue names gets one line `hidetc: error: ...`, exit code 2, and leaves nothing behind."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from click.testing import CliRunner
from helpers.onnx_util import one_node_model
from onnx import TensorProto, helper

from hidetc.tools.cli import main

RNG = np.random.default_rng(0)
W = RNG.standard_normal((5, 3)).astype(np.float32)


def _mlp(opset: int = 17) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="/mm"),
             helper.make_node("Relu", ["h"], ["y"], name="/relu")]
    graph = helper.make_graph(nodes, "mlp", [x], [y], [onnx.numpy_helper.from_array(W, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def invoke(*args: str):
    result = CliRunner().invoke(main, [str(a) for a in args])
    return result


def assert_one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("hidetc: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.output


def assert_nothing_written(parent: Path, out_name: str) -> None:
    leftovers = [p.name for p in parent.iterdir() if out_name in p.name]
    assert leftovers == [], leftovers


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    model = root / "mlp.onnx"
    onnx.save(_mlp(), model)
    result = invoke("compile", model, "-o", root / "out", "--target", "cpu")
    assert result.exit_code == 0, result.output + str(result.exception)
    return root, model, root / "out"


def test_compile_reports_verification(artifact):
    root, model, out = artifact
    assert (out / "manifest.yaml").is_file()
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert manifest["verification"]["status"] == "passed"
    assert manifest["verification"]["outputs"]["y"]["rel_error"] <= 1e-4
    assert not [p for p in root.iterdir() if p.name.startswith(".out")]


def test_run_prints_summary_and_latency(artifact, tmp_path):
    _, model, out = artifact
    x = RNG.standard_normal((2, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    result = invoke("run", out, "--input", tmp_path / "x.npy", "--output", tmp_path / "y.npz",
                    "--repeat", 2, "--compare", model)
    assert result.exit_code == 0, result.output
    assert "y: float32[2, 3]" in result.output
    assert "latency (hidetc, cpu)" in result.output
    assert "latency (onnxruntime, cpu)" in result.output
    with np.load(tmp_path / "y.npz") as saved:
        np.testing.assert_allclose(saved["y"], np.maximum(x @ W, 0), rtol=1e-5, atol=1e-6)


def test_run_compare_exits_1_when_an_output_misses_the_tolerance(artifact, tmp_path):
    """`run --compare` against another model (weights off by 1%): the errors are
    printed, then one line naming the output and the tolerance, exit 1 (a CI step can
    rely on it); the artifact's own model passes (exit 0, above)."""
    _, _, out = artifact
    other = _mlp()
    other.graph.initializer[0].CopyFrom(onnx.numpy_helper.from_array(W * 1.01, "w"))
    onnx.save(other, tmp_path / "other.onnx")
    np.save(tmp_path / "x.npy", RNG.standard_normal((2, 5)).astype(np.float32))
    result = invoke("run", out, "--input", tmp_path / "x.npy", "--repeat", 1,
                    "--compare", tmp_path / "other.onnx")
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hidetc: error: output 'y' differs"), lines
    assert "tolerance 0.0001" in lines[0] and "Traceback" not in result.output
    # and on the cpu the kernels judged one by one name the one that differs
    assert re.search(r"; the first kernel that differs on exact inputs: matmul\w* "
                     r"\(MatMul '[^']+'\)", lines[0]), lines[0]


def test_inspect_json(artifact):
    _, _, out = artifact
    result = invoke("inspect", out, "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["target"] == "cpu"
    assert [k["op"] for k in doc["kernels"]] == ["MatMul"]   # the Relu is its epilogue
    assert doc["verification"]["status"] == "passed"
    memory = doc["memory"]        # what each pass in flight holds: its arena, and scratch
    assert memory["context_bytes"] == memory["arena_bytes"]
    assert memory["scratch_bytes_per_thread"] >= 0
    assert memory["scratch_bytes_per_thread"] == max(k["scratch_bytes"] for k in doc["kernels"])
    text = invoke("inspect", out)
    assert "1 launches" in text.output and "verification: passed" in text.output
    assert "per pass in flight:" in text.output


def test_not_a_file(tmp_path):
    result = invoke("compile", tmp_path / "missing.onnx", "-o", tmp_path / "out")
    assert_one_line_error(result, "missing.onnx", "no such file")
    assert_nothing_written(tmp_path, "out")


def test_directory_as_model(tmp_path):
    assert_one_line_error(invoke("compile", tmp_path, "-o", tmp_path / "out"), "not a file")


def test_not_onnx(tmp_path):
    (tmp_path / "bad.onnx").write_text("this is not a protobuf")
    result = invoke("compile", tmp_path / "bad.onnx", "-o", tmp_path / "out")
    assert_one_line_error(result, "bad.onnx", "not a valid ONNX model")
    assert_nothing_written(tmp_path, "out")


def test_truncated_protobuf(tmp_path):
    data = _mlp().SerializeToString()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 2])
    result = invoke("compile", tmp_path / "cut.onnx", "-o", tmp_path / "out")
    assert_one_line_error(result, "cut.onnx")
    assert_nothing_written(tmp_path, "out")


@pytest.mark.parametrize("opset", [0, 29])
def test_opset_out_of_range(tmp_path, opset):
    onnx.save(_mlp(opset), tmp_path / "m.onnx")
    result = invoke("compile", tmp_path / "m.onnx", "-o", tmp_path / "out")
    assert_one_line_error(result, f"opset {opset}", "1-28")
    assert_nothing_written(tmp_path, "out")


def test_unsupported_ops_listed_once_each(tmp_path):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])
    nodes = [helper.make_node("Foo", ["x"], ["a"], name="first_foo", domain="custom"),
             helper.make_node("Foo", ["a"], ["b"], name="second_foo", domain="custom"),
             helper.make_node("Bar", ["b"], ["y"], name="the_bar", domain="custom")]
    graph = helper.make_graph(nodes, "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("custom", 1)])
    onnx.save(model, tmp_path / "m.onnx")
    result = invoke("compile", tmp_path / "m.onnx", "-o", tmp_path / "out")
    assert_one_line_error(result, "Foo", "first_foo", "Bar", "the_bar")
    assert "second_foo" not in result.stderr


def test_output_dir_that_is_not_an_artifact(tmp_path):
    onnx.save(_mlp(), tmp_path / "m.onnx")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    result = invoke("compile", tmp_path / "m.onnx", "-o", tmp_path / "out")
    assert_one_line_error(result, "not a hidetc artifact")
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"


def test_verification_failure_leaves_nothing(tmp_path):
    # Tanh after a long dot product: libm's tanhf and a different summation order never
    # agree with ONNX Runtime to the last bit on 4096 values, so a tolerance of 1e-30 fails.
    x = RNG.standard_normal((64, 512)).astype(np.float32)
    w = RNG.standard_normal((512, 64)).astype(np.float32) / 8
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Tanh", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_tensor_value_info("y", 1, (64, 64))],
                              [onnx.numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    strict = tmp_path / "strict.yaml"
    strict.write_text("rtol: 1.0e-30\n")
    result = invoke("compile", tmp_path / "m.onnx", "-o", tmp_path / "out", "--config", strict)
    assert_one_line_error(result, "verification failed", "'y'")
    assert_nothing_written(tmp_path, "out")


def test_a_model_onnx_runtime_cannot_run_is_verified_against_the_numpy_reference(tmp_path):
    """ONNX Runtime has no BitCast from bool: compile verifies against hidetc's numpy
    reference instead and says why; `run --compare` (an explicit comparison with ORT)
    fails with one line."""
    model = one_node_model("BitCast", {"x": np.array([True, False])}, ["y"],
                           {"to": TensorProto.UINT8}, opset=26)
    model.ir_version = 11
    onnx.save(model, tmp_path / "m.onnx")
    result = invoke("compile", tmp_path / "m.onnx", "-o", tmp_path / "out", "--target", "cpu")
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "verification: passed against the numpy reference (onnxruntime cannot run this " \
           "model: NOT_IMPLEMENTED" in result.output, result.output
    manifest = yaml.safe_load((tmp_path / "out" / "manifest.yaml").read_text())
    assert manifest["verification"]["reference"].startswith("the numpy reference")
    np.save(tmp_path / "x.npy", np.array([True, True]))
    result = invoke("run", tmp_path / "out", "--input", tmp_path / "x.npy",
                    "--compare", tmp_path / "m.onnx")
    assert_one_line_error(result, "m.onnx: ONNX Runtime cannot run this model",
                          "BitCast")


def test_bad_config(tmp_path):
    onnx.save(_mlp(), tmp_path / "m.onnx")
    (tmp_path / "c.yaml").write_text("optimise: yes\n")
    result = invoke("compile", tmp_path / "m.onnx", "-o", tmp_path / "out",
                    "--config", tmp_path / "c.yaml")
    assert_one_line_error(result, "c.yaml", "unknown option", "optimise")


@pytest.mark.parametrize("inputs, fragments", [
    ({}, ["missing input 'x'"]),
    ({"x": np.zeros((2, 4), np.float32)}, ["'x'", "expected shape [2, 5]", "got [2, 4]"]),
    ({"x": np.zeros((2, 5), np.float64)}, ["'x'", "expected dtype float32", "got float64"]),
    ({"x": np.zeros((2, 5), np.float32), "z": np.zeros(1)}, ["unknown input", "z"]),
])
def test_run_bad_inputs(artifact, tmp_path, inputs, fragments):
    _, _, out = artifact
    np.savez(tmp_path / "in.npz", **inputs)
    assert_one_line_error(invoke("run", out, "--input", tmp_path / "in.npz"), *fragments)


def test_run_input_file_missing(artifact, tmp_path):
    _, _, out = artifact
    assert_one_line_error(invoke("run", out, "--input", tmp_path / "nope.npy"), "nope.npy")


def _copy_artifact(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for path in src.rglob("*"):
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            target.write_bytes(path.read_bytes())
    return dst


def test_modified_artifact_file(artifact, tmp_path):
    out = _copy_artifact(artifact[2], tmp_path / "copy")
    weights = out / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[0] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert_one_line_error(invoke("run", out), "weights.bin", "checksum")


def test_newer_manifest_format(artifact, tmp_path):
    out = _copy_artifact(artifact[2], tmp_path / "copy")
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    manifest["format_version"] = 99
    (out / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    assert_one_line_error(invoke("inspect", out), "format version 99", "newer")


def test_not_an_artifact(tmp_path):
    assert_one_line_error(invoke("run", tmp_path), "not a hidetc artifact")


def test_debug_shows_traceback(tmp_path):
    result = invoke("--debug", "compile", tmp_path / "missing.onnx", "-o", tmp_path / "out")
    assert result.exit_code != 0
    assert result.exception is not None and "no such file" in str(result.exception)


def test_one_node_models_through_cli(tmp_path):
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    onnx.save(one_node_model("Softmax", {"x": x}, ["y"], {"axis": 1}), tmp_path / "s.onnx")
    np.savez(tmp_path / "sample.npz", x=x)
    result = invoke("compile", tmp_path / "s.onnx", "-o", tmp_path / "out",
                    "--sample", tmp_path / "sample.npz")
    assert result.exit_code == 0, result.output
    assert "sample.npz" in result.output
    assert os.path.isfile(tmp_path / "out" / "kernels" / "model.so")
