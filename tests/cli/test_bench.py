"""`hidetc bench`: a model file and an artifact directory timed beside ONNX Runtime,
the JSON document, per-kernel profiles, and one-line errors for bad subjects."""
from __future__ import annotations

import json

import onnx
from click.testing import CliRunner
from helpers.fusion_graphs import resnet_block

from hidetc.tools.cli import main


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_bench_model_file_and_artifact(tmp_path):
    path = tmp_path / "block.onnx"
    onnx.save(resnet_block(), path)
    out = tmp_path / "bench.json"
    result = invoke("bench", path, "--repeat", "3", "--profile", "--json", out,
                    "--work", tmp_path / "work")
    assert result.exit_code == 0, result.output
    assert "block" in result.output and "passed" in result.output
    doc = json.loads(out.read_text())
    row = doc["rows"][0]
    assert row["hidetc_ms"] > 0 and row["onnxruntime_ms"] > 0 and row["check"] == "passed"
    assert row["ratio_onnxruntime"] == row["hidetc_ms"] / row["onnxruntime_ms"]
    assert row["ratio_onnxruntime_paired"] > 0 and "paired" in result.output
    assert len(row["profile"]) == row["kernels"] == 5   # + the input's NHWC transpose
    assert all(p["ms"] >= 0 for p in row["profile"])
    assert row["hidetc_peak_mb"] > 0 and row["onnxruntime_peak_mb"] > 0
    artifact = tmp_path / "work" / "block-f32.out"
    again = invoke("bench", artifact, "--repeat", "2", "--no-memory", "--work", tmp_path / "w2")
    assert again.exit_code == 0, again.output
    assert "block-f32.out" in again.output


def test_bench_a_model_onnx_runtime_cannot_run(tmp_path):
    """hidetc is timed alone and the table says why ORT is not (BitCast of bool)."""
    import numpy as np
    from helpers.onnx_util import bitcast_model
    path = tmp_path / "bits.onnx"
    onnx.save(bitcast_model(np.array([True, False]), "uint8"), path)
    result = invoke("bench", path, "--repeat", "2", "--no-memory", "--json",
                    tmp_path / "b.json", "--work", tmp_path / "work")
    assert result.exit_code == 0, result.output
    assert "no ORT timing: onnxruntime cannot run this model: NOT_IMPLEMENTED" in \
        result.output, result.output
    row = json.loads((tmp_path / "b.json").read_text())["rows"][0]
    assert row["hidetc_ms"] > 0 and "onnxruntime_ms" not in row


def test_bench_bad_subject(tmp_path):
    result = invoke("bench", "no_such_model", "--work", tmp_path)
    assert result.exit_code == 2
    assert "hidetc: error: no_such_model: not a model file" in result.output


def test_paired_ratio_is_the_median_of_per_round_ratios():
    from hidetc.tools.bench import alternate, paired_ratio
    assert paired_ratio([2.0, 4.0, 9.0], [1.0, 2.0, 3.0]) == 2.0
    timed = alternate({"a": lambda: None, "b": lambda: None}, repeat=6, rounds=3, pause=0)
    assert [len(t["round_best_ms"]) for t in timed.values()] == [3, 3]


def test_profile_and_table_lines_of_a_cuda_row():
    """A cuda row's profile lines name grid, block, template and config (a rule kernel
    says so), the slowest first; a row that ran without its CUDA graph says why."""
    from hidetc.tools.bench_report import format_table, profile_lines
    profile = [{"kernel": "k0", "op": "Relu", "node": "n0", "ms": 0.01, "template": None,
                "config": None, "grid": [4, 1, 1], "block": [256, 1, 1]},
               {"kernel": "k1", "op": "MatMul", "node": "n1", "ms": 0.03,
                "template": "cuda.matmul_tc", "config": "TcConfig(bm=64)",
                "grid": [12, 2, 1], "block": [128, 1, 1]}]
    row = {"model": "m", "target": "cuda", "precision": "f16", "hidetc_ms": 0.05,
           "kernels": 2, "profile": profile, "cuda_graph": False,
           "cuda_graph_unavailable": "stream capture failed: x"}
    lines = profile_lines(row)
    assert lines[0] == "m: 2 launches, 0.04 ms in kernels"
    assert "grid [12, 2, 1] block [128, 1, 1]  cuda.matmul_tc TcConfig(bm=64)" in lines[1]
    assert "75.0%" in lines[1] and "rule" in lines[2]
    assert "no CUDA graph: stream launches (stream capture failed: x)" in format_table([row])
