"""Verification at the precision the model computes in (issue 34): each output's bound
follows the narrowest float type on its path (float16 -> 1e-2), per output in the
manifest; an output beyond its bound passes when hidetc is within it of the exact
reference (the interpreter in float64, rounded to the declared types) and no farther
from it than the reference engine; `hidetc run --compare` and the conformance runner
judge the same way."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import hidetc
from hidetc.driver.verification import verify_artifact
from hidetc.driver.verify import compare, exact_outputs, failing, output_tolerances, settle
from hidetc.errors import VerificationError
from hidetc.frontend.onnx.importer import load_model
from hidetc.tools.cli import main as cli

V = helper.make_tensor_value_info
F32, F16 = TensorProto.FLOAT, TensorProto.FLOAT16


def _model(path, opset=17):
    """Two outputs: `half` passes through a float16 LayerNormalization (Casts around
    it), `full` stays float32 but its Reshape's shape comes from the float16 value."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.random(32).astype(np.float16), n) for n in "sb"]
    inits.append(numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32),
                                         "w"))
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=F16),
             helper.make_node("LayerNormalization", ["h", "s", "b"], ["l"], axis=-1),
             helper.make_node("Cast", ["l"], ["half"], to=F32),
             helper.make_node("Shape", ["h"], ["shape"]),
             helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Reshape", ["m", "shape"], ["full"])]
    graph = helper.make_graph(nodes, "mixed", [V("x", F32, [8, 32])],
                              [V("half", F32, [8, 32]), V("full", F32, [8, 32])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_each_output_gets_its_paths_tolerance(tmp_path):
    graph = load_model(_model(tmp_path / "m.onnx"))
    assert output_tolerances(graph, 1e-4) == {"half": 1e-2, "full": 1e-4}
    assert output_tolerances(graph, 1e-2) == {"half": 1e-2, "full": 1e-2}


def test_a_float16_model_compiles_with_the_defaults(tmp_path):
    path = _model(tmp_path / "m.onnx")
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    outputs = result.manifest["verification"]["outputs"]
    assert outputs["half"]["tolerance"] == 1e-2 and outputs["full"]["tolerance"] == 1e-4
    shown = CliRunner().invoke(cli, ["run", str(tmp_path / "out"), "--compare", str(path),
                                     "--repeat", "2"])
    assert shown.exit_code == 0, shown.output
    assert "tolerance 0.01" in shown.output and "tolerance 0.0001" in shown.output
    cross = hidetc.compile_model(path, tmp_path / "cuda", target="cuda", arch="sm_90")
    assert cross.manifest["verification"]["status"] == "skipped"


def test_an_explicit_rtol_holds_for_every_output(tmp_path):
    path = _model(tmp_path / "m.onnx")
    with pytest.raises(VerificationError, match="output 'half'.*tolerance 1e-07"):
        hidetc.compile_model(path, tmp_path / "out", target="cpu", rtol=1e-7)


def _report(got, ref, rtol):
    return compare({"y": got}, {"y": ref}, {"y": rtol})


def test_settle_against_the_exact_reference():
    exact = np.linspace(-1, 1, 64)
    near, far = exact * (1 + 1e-6), exact * (1 + 3e-3)
    # the reference engine strays, hidetc does not: passes, both errors recorded
    report = settle(_report(near, far, 1e-3), {"y": 1e-3}, {"y": near}, {"y": far},
                    lambda: {"y": exact}, "onnxruntime")
    entry = report["outputs"]["y"]
    assert report["status"] == "passed" and "passed_by" in entry
    assert entry["exact"]["hidetc"] < 1e-5 < 1e-3 < entry["exact"]["onnxruntime"]
    # hidetc strays: fails, the exact errors said
    report = settle(_report(far, near, 1e-3), {"y": 1e-3}, {"y": far}, {"y": near},
                    lambda: {"y": exact}, "onnxruntime")
    assert report["status"] == "failed" and "passed_by" not in report["outputs"]["y"]
    # both stray beyond the bound, hidetc less: still a failure
    farther = exact * (1 + 9e-3)
    report = settle(_report(far, farther, 1e-3), {"y": 1e-3}, {"y": far}, {"y": farther},
                    lambda: {"y": exact}, "onnxruntime")
    assert report["status"] == "failed"
    # integer mismatches are never settled; nothing is computed for them
    ints = compare({"y": np.array([1, 2])}, {"y": np.array([1, 3])}, 1e-4)
    assert settle(ints, 1e-4, {}, {}, lambda: pytest.fail("computed"), "x") is ints


def test_a_straying_reference_engine_does_not_fail_the_compile(tmp_path):
    path = _model(tmp_path / "m.onnx")

    def straying(out, manifest, yardstick, cfg):   # ONNX Runtime off by 1e-3
        yardstick.reference = {k: v * np.float32(1.001) for k, v in yardstick.reference.items()}
        return verify_artifact(out, manifest, yardstick, cfg)
    manifest = hidetc.compile_model(path, tmp_path / "out", target="cpu",
                                    verifier=straying).manifest
    full = manifest["verification"]["outputs"]["full"]
    assert full["rel_error"] > 1e-4 and full["exact"]["hidetc"] < 1e-5
    assert full["exact"]["onnxruntime"] > 5e-4 and "strays" in full["passed_by"]


def test_the_exact_reference_keeps_the_models_own_rounding(tmp_path):
    graph = load_model(_model(tmp_path / "m.onnx"))
    x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
    exact = exact_outputs(graph, {"x": x})
    assert exact["half"].dtype == np.float32
    # the Cast to float16 still rounds: every value is a float16 value
    np.testing.assert_array_equal(exact["half"], exact["half"].astype(np.float16))
    np.testing.assert_allclose(exact["full"], x.astype(np.float64) @ np.asarray(
        numpy_helper.to_array(onnx.load(tmp_path / "m.onnx").graph.initializer[2]),
        np.float64), rtol=1e-6)


@pytest.mark.parametrize("dtype", [TensorProto.BFLOAT16, TensorProto.FLOAT16])
def test_the_exact_reference_widens_every_narrow_float(tmp_path, monkeypatch, dtype):
    """Every node of the exact reference receives its float inputs as float64, bfloat16
    (an ml_dtypes type numpy does not call a float) included; its result is rounded once
    to the declared type."""
    from hidetc.graph import reference
    seen = []
    real = reference.evaluate_node

    def spy(node, args):
        seen.append((node.op, [str(a.dtype) for a in args if a is not None]))
        return real(node, args)
    monkeypatch.setattr(reference, "evaluate_node", spy)
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["n"], to=dtype),
         helper.make_node("Mul", ["n", "n"], ["y"])], "narrow",
        [V("x", F32, [1, 64])], [V("y", dtype, [1, 64])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.save(model, tmp_path / "narrow.onnx")
    x = np.random.default_rng(2).standard_normal((1, 64)).astype(np.float32)
    got = exact_outputs(load_model(tmp_path / "narrow.onnx"), {"x": x})["y"]
    assert dict(seen)["Mul"] == ["float64", "float64"]
    assert str(got.dtype) == load_model(tmp_path / "narrow.onnx").types["y"].dtype


def test_a_failure_names_an_output_the_exact_reference_did_not_pass():
    """Of two outputs beyond their bounds, the one the exact reference passes is no
    longer failing; the report fails on the other alone."""
    exact = np.linspace(-1, 1, 64)
    near, far = exact * (1 + 1e-6), exact * (1 + 3e-3)
    outputs, reference = {"a": near, "b": far * 10}, {"a": far, "b": far}
    report = settle(compare(outputs, reference, {"a": 1e-3, "b": 1e-3}),
                    {"a": 1e-3, "b": 1e-3}, outputs, reference,
                    lambda: {"a": exact, "b": exact}, "onnxruntime")
    assert report["status"] == "failed" and "passed_by" in report["outputs"]["a"]
    assert failing(report, {"a": 1e-3, "b": 1e-3}) == ["b"]


def test_the_record_keeps_the_base_and_each_outputs_bound(tmp_path):
    path = _model(tmp_path / "m.onnx")
    shown = CliRunner().invoke(cli, ["compile", str(path), "-o", str(tmp_path / "out"),
                                     "--target", "cpu"])
    assert shown.exit_code == 0, shown.output
    manifest = hidetc.load(tmp_path / "out").manifest["verification"]
    assert manifest["tolerance"] == 1e-4
    inspected = CliRunner().invoke(cli, ["inspect", str(tmp_path / "out")])
    assert inspected.exit_code == 0, inspected.output
    assert "half rel" in inspected.output and "(tolerance 0.01)" in inspected.output
