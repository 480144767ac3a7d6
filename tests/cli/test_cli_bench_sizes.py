"""`hidetc bench` over ranges of sizes (issue 36): `--dim`/`--shape` go to the compile,
a dynamic artifact is timed at each combination of its sizes (`--at`, default each
range's min, tuning sizes and max), one row per combination naming its `sizes`, checked
against ONNX Runtime on the same feeds; a size outside its range, an `--at` name the
artifact has no symbol of, or sizes bound for an artifact directory are one-line errors.
Results only: no timing is judged."""
from __future__ import annotations

import json

import onnx
import pytest
from helpers import cli
from helpers.cli import invoke, relu_model

from hidetc.graph.dims import default_opts


def assert_one_line_error(result, *fragments: str) -> None:
    cli.assert_one_line_error(result, *fragments, alone=False)


@pytest.fixture(scope="module")
def ranged(tmp_path_factory):
    """`hidetc bench` of a model with a symbolic batch N compiled for N=1..16: (the
    model file, the work dir, the bench's output and JSON document)."""
    root = tmp_path_factory.mktemp("bench_sizes")
    path = root / "dyn.onnx"
    onnx.save(relu_model(["N", 3]), path)
    result = invoke("bench", path, "--target", "cpu", "--dim", "N=1..16", "--repeat", 2,
                    "--no-memory", "--json", root / "b.json", "--work", root / "work")
    assert result.exit_code == 0, result.output + str(result.exception)
    return path, root / "work", result.output, json.loads((root / "b.json").read_text())


def test_a_row_per_default_size_each_checked_against_onnx_runtime(ranged):
    _, work, output, doc = ranged
    want = sorted({1, 16, *default_opts(1, 16)})           # min, tuning sizes, max
    rows = doc["rows"]
    assert [r["sizes"] for r in rows] == [{"N": n} for n in want]
    for r in rows:
        assert r["model"] == "dyn" and r["target"] == "cpu"
        assert r["check"] == "passed" and r["hidetc_ms"] > 0 and r["onnxruntime_ms"] > 0
        assert "hidetc_peak_mb" not in r                     # --no-memory
        assert f"dyn N={r['sizes']['N']} " in output
        assert isinstance(r["variant"], int)              # the dispatch variant serving it
    assert [p.name for p in work.glob("*.out")] == ["dyn-f32-N=1..16.out"]


def test_an_artifact_directory_is_timed_at_the_sizes_given(ranged, monkeypatch):
    """(Its model file is not beside it: hidetc alone, on seeded inputs at each size.)"""
    from hidetc.tools import bench
    _, work, _, _ = ranged
    artifact = work / "dyn-f32-N=1..16.out"
    fed, make = [], bench._inputs
    monkeypatch.setattr(bench, "_inputs", lambda *a, **k: fed.append(make(*a, **k)) or fed[-1])
    result = invoke("bench", artifact, "--at", "N=5,2,5", "--repeat", 2, "--no-memory",
                    "--json", work / "a.json", "--work", work)
    assert result.exit_code == 0, result.output + str(result.exception)
    rows = json.loads((work / "a.json").read_text())["rows"]
    assert [r["sizes"] for r in rows] == [{"N": 5}, {"N": 2}]     # given order, once each
    assert all(r["model"] == artifact.name and r["hidetc_ms"] > 0 for r in rows)
    assert [f["x"].shape for f in fed] == [(5, 3), (2, 3)]


def test_two_dimensions_by_shape_every_combination(tmp_path):
    """--shape binds both named dims; --at one of them, the other at its defaults."""
    path = tmp_path / "two.onnx"
    onnx.save(relu_model(["batch", "seq", 3]), path)
    result = invoke("bench", path, "--target", "cpu", "--shape", "x=1..3x1..8x3", "--at",
                    "seq=5", "--repeat", 2, "--no-memory", "--json", tmp_path / "b.json",
                    "--work", tmp_path / "work")
    assert result.exit_code == 0, result.output + str(result.exception)
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [r["sizes"] for r in rows] == [{"batch": b, "seq": 5}
                                          for b in sorted({1, 3, *default_opts(1, 3)})]
    assert all(r["check"] == "passed" for r in rows)
    assert "two batch=2 seq=5 cpu" in result.output


def test_a_static_compile_keeps_one_row_without_sizes(tmp_path):
    path = tmp_path / "dyn.onnx"
    onnx.save(relu_model(["N", 3]), path)
    result = invoke("bench", path, "--target", "cpu", "--dim", "N=4", "--repeat", 2,
                    "--no-memory", "--json", tmp_path / "b.json", "--work", tmp_path / "work")
    assert result.exit_code == 0, result.output + str(result.exception)
    (row,) = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert "sizes" not in row and row["check"] == "passed"        # fed at N=4, not 0
    artifact = tmp_path / "work" / "dyn-f32-N=4.out"
    assert_one_line_error(invoke("bench", artifact, "--at", "N=4", "--work", tmp_path / "w"),
                          "--at N: not a symbolic dimension of dyn-f32-N=4.out",
                          "a static artifact")


def test_out_of_range_sizes_are_one_line_errors(ranged, tmp_path):
    path, work, _, _ = ranged
    before = invoke("bench", path, "--dim", "N=1..16", "--at", "N=2,17", "--work",
                    tmp_path / "w")           # known from --dim: refused before compiling
    assert_one_line_error(before, "--at N=17", "outside the range 1..16", "dimension 'N'")
    assert "compiling" not in before.stderr
    after = invoke("bench", work / "dyn-f32-N=1..16.out", "--at", "N=0", "--work", tmp_path)
    assert_one_line_error(after, "--at 'N=0'", "positive sizes")
    after = invoke("bench", work / "dyn-f32-N=1..16.out", "--at", "N=40", "--work", tmp_path)
    assert_one_line_error(after, "--at N=40", "outside the range 1..16", "dimension 'N'")


def test_unknown_names_and_bindings_of_an_artifact_are_one_line_errors(ranged, tmp_path):
    _, work, _, _ = ranged
    artifact = work / "dyn-f32-N=1..16.out"
    assert_one_line_error(invoke("bench", artifact, "--at", "seq=4", "--work", tmp_path),
                          "--at seq: not a symbolic dimension",
                          "its symbolic dimensions: N")
    assert_one_line_error(invoke("bench", artifact, "--dim", "N=1..4", "--work", tmp_path),
                          "--dim and --shape bind the sizes of a compile",
                          "is an artifact directory")


def test_size_points_combinations():
    from hidetc.tools.bench import size_points
    manifest = {"dynamic": {"order": ["b", "s"],
                            "symbols": {"s": {"min": 1, "max": 64, "opt": [8, 64]},
                                        "b": {"min": 1, "max": 2, "opt": [1]}}}}
    assert size_points(manifest, {"s": [16]}, "m") == [{"b": 1, "s": 16}, {"b": 2, "s": 16}]
    assert [p["s"] for p in size_points(manifest, {"b": [2]}, "m")] == [1, 8, 64]
    assert size_points({}, None, "m") == [{}]
