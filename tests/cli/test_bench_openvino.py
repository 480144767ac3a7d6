"""`hidetc bench --vs openvino` (issue 37): OpenVINO's CPU plugin on the same model file
at its default inference precision and at f32, each engine's norm-wise relative error
against ONNX Runtime, and a one-line error saying how to install openvino where it is
missing. Results only: no timing is judged."""
from __future__ import annotations

import builtins
import json

import numpy as np
import onnx
import pytest
from helpers.cli import assert_one_line_error, invoke
from onnx import TensorProto, helper, numpy_helper

RNG = np.random.default_rng(0)
W = RNG.standard_normal((64, 32)).astype(np.float32)


def matmul_relu() -> onnx.ModelProto:
    """z = relu(x @ W), x of 4x64."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 32])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "g", [x], [z], [numpy_helper.from_array(W, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_without_openvino_a_one_line_error_saying_how_to_install(tmp_path, monkeypatch):
    """Raised before the compile, for a model file or a benchmark model alike."""
    real = builtins.__import__

    def no_openvino(name, *args, **kwargs):
        if name == "openvino" or name.startswith("openvino."):
            raise ImportError(f"No module named '{name}'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_openvino)
    path = tmp_path / "mm.onnx"
    onnx.save(matmul_relu(), path)
    result = invoke("bench", path, "--vs", "openvino", "--no-memory", "--work", tmp_path / "w")
    assert_one_line_error(result, "--vs openvino needs OpenVINO",
                          "pip install 'hidetc[openvino]'", alone=False)
    assert not (tmp_path / "w" / "mm-f32.out").exists()      # (no compile ran)


def test_norm_error_is_the_largest_relative_error_over_outputs():
    from hidetc.tools.bench import norm_error
    ref = {"a": np.array([3.0, 4.0]), "b": np.array([1, 0], np.int64)}
    assert norm_error({"a": np.array([3.0, 4.0]), "b": np.array([1, 0])}, ref) == 0.0
    assert norm_error({"a": np.array([3.0, 4.5]), "b": np.array([1, 0])}, ref) == 0.1
    assert norm_error({"a": np.array([3.0, 4.0]), "b": np.array([0, 0])}, ref) == 1.0
    assert norm_error({"a": np.array([3.0, 4.0])}, ref) == float("inf")
    assert norm_error({"a": np.zeros(3), "b": np.array([1, 0])}, ref) == float("inf")


def test_openvino_peers_match_numpy(tmp_path):
    """Both peers (defaults, f32) run the model file and give its outputs by their ONNX
    names; f32 within 1e-5 of numpy, the default precision (bf16 where the CPU has it)
    within 1e-2, norm-wise."""
    pytest.importorskip("openvino")
    from hidetc.tools.bench import norm_error
    from hidetc.tools.bench_openvino import openvino_peers
    path = tmp_path / "mm.onnx"
    onnx.save(matmul_relu(), path)
    peers, why = openvino_peers(path, "cpu", ["z"])
    assert why is None and list(peers) == ["openvino", "openvino_f32"]
    x = RNG.standard_normal((4, 64)).astype(np.float32)
    want = {"z": np.maximum(x.astype(np.float64) @ W, 0)}
    for name, peer in peers.items():
        got = peer.run({"x": x})
        assert list(got) == ["z"] and got["z"].shape == (4, 32)
        assert norm_error(got, want) < (1e-5 if name == "openvino_f32" else 1e-2), name
    assert peers["openvino_f32"].precision == "f32"
    assert peers["openvino"].precision in ("f32", "bf16", "f16")
    assert openvino_peers(path, "cuda")[1].startswith("OpenVINO's CPU plugin is timed")


def test_bench_vs_openvino_columns_and_errors(tmp_path):
    """The row holds both OpenVINO columns (ms, ratios, inference precision, error), and
    hidetc's error; the table prints a line per OpenVINO column and the err column."""
    pytest.importorskip("openvino")
    path = tmp_path / "mm.onnx"
    onnx.save(matmul_relu(), path)
    out = tmp_path / "b.json"
    result = invoke("bench", path, "--vs", "openvino", "--target", "cpu", "--repeat", 2,
                    "--no-memory", "--no-tune", "--json", out, "--work", tmp_path / "w")
    assert result.exit_code == 0, result.output + str(result.exception)
    doc = json.loads(out.read_text())
    row = doc["rows"][0]
    assert doc["openvino"] and row["check"] == "passed"
    assert 0 <= row["hidetc_error"] < 1e-5
    for peer in ("openvino", "openvino_f32"):
        assert row[f"{peer}_ms"] > 0
        assert row[f"ratio_{peer}"] == row["hidetc_ms"] / row[f"{peer}_ms"]
        assert row[f"ratio_{peer}_paired"] > 0
        assert 0 <= row[f"{peer}_error"] < 1e-2
        assert f"vs {peer} ({row[peer + '_precision']}): " in result.output
    assert row["openvino_f32_precision"] == "f32" and row["openvino_f32_error"] < 1e-5
    header = result.output.splitlines()[0]
    assert header.split()[-2:] == ["err", "check"]


def test_a_model_openvino_cannot_read_is_timed_without_it(tmp_path):
    """(An op of a domain OpenVINO has no conversion for: a note under the row.)"""
    pytest.importorskip("openvino")
    from hidetc.tools.bench_openvino import openvino_peers
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("FooOp", ["x"], ["y"], domain="my.ops")],
                              "g", [x], [y])
    path = tmp_path / "foo.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                      helper.make_opsetid("my.ops", 1)]), path)
    peers, why = openvino_peers(path, "cpu")
    assert peers == {} and why.startswith("openvino cannot compile this model: ")
    assert "\n" not in why and "FooOp" in why
