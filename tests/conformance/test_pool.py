"""The conformance pool contains crashes and hangs (each a recorded result, the run goes
on), classifies results, and the report checks the expected-failure list both ways."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from hidetc.tools.conformance.cases import write_case
from hidetc.tools.conformance.pool import run_cases
from hidetc.tools.conformance.report import (
    cause,
    compare_expected,
    counts,
    load_expected,
    write_expected,
)
from hidetc.tools.conformance.worker import run_case

HERE = Path(__file__).resolve().parent
MISBEHAVING = "misbehaving_backend:MisbehavingBackend"


def _unary_case(root: Path, op: str):
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    model = helper.make_model(helper.make_graph(
        [helper.make_node(op, ["x"], ["y"])], op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]),
        opset_imports=[helper.make_opsetid("", 17)])
    expected = {"Abs": np.abs, "Relu": lambda a: np.maximum(a, 0), "Neg": np.negative,
                "Sign": np.sign, "Floor": np.floor, "Ceil": np.ceil}[op](x)
    return write_case(root, f"test_{op.lower()}", model, [([x], [expected])])


def test_crashes_and_hangs_are_contained(tmp_path):
    ops = ["Abs", "Relu", "Neg", "Sign", "Floor", "Ceil"]
    cases = [_unary_case(tmp_path / "cases", op) for op in ops]
    results = run_cases(cases, backend=MISBEHAVING, jobs=2, timeout=8,
                        log_dir=tmp_path / "logs", env={"PYTHONPATH": str(HERE)})
    by_op = {r["op"]: r for r in results}
    assert len(results) == len(ops)
    assert by_op["Abs"]["status"] == "crash"
    assert "SIGSEGV during run data set 0" in by_op["Abs"]["reason"]
    assert "Segmentation fault" in by_op["Abs"]["log"]          # faulthandler's stack
    assert by_op["Relu"]["status"] == "crash" and "timeout after 8 s" in by_op["Relu"]["reason"]
    assert by_op["Neg"]["status"] == "crash" and "exit code 3 during compile" in \
        by_op["Neg"]["reason"]
    assert (by_op["Sign"]["status"], by_op["Sign"]["internal"]) == ("error", True)
    assert by_op["Sign"]["reason"] == "RuntimeError: deliberate failure"
    assert by_op["Floor"]["status"] == "fail" and "Mismatched elements" in by_op["Floor"]["reason"]
    assert by_op["Ceil"]["status"] == "pass"                    # the run went on
    assert cause(by_op["Abs"]) == "crash: worker killed by SIGSEGV during run data set 0"
    assert cause(by_op["Floor"]) == "wrong values (beyond rtol/atol)"


def test_hidetc_backend_in_process(tmp_path):
    ok = run_case(_unary_case(tmp_path, "Relu"), _backend())
    assert ok["status"] == "pass", ok
    x = np.ones((2, 2), np.float32)
    model = helper.make_model(helper.make_graph(
        [helper.make_node("Unique", ["x"], ["y"])], "e",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 17)])
    bad = run_case(write_case(tmp_path, "test_unique", model, [([x], [np.unique(x)])]),
                   _backend())
    assert (bad["status"], bad["stage"], bad["internal"]) == ("error", "compile", False)
    assert cause(bad) == "unsupported ops: Unique"


def _backend():
    from hidetc.tools.onnx_backend import HidetcBackend
    return HidetcBackend


def test_expected_list_round_trip_and_honesty(tmp_path):
    results = [
        {"name": "test_a", "op": "A", "status": "pass", "reason": ""},
        {"name": "test_b", "op": "B", "status": "error", "reason":
            "compile failed: model.onnx: unsupported ops: Foo (node 'n0'), Bar (node 'n1')"},
        {"name": "test_c", "op": "C", "status": "fail", "reason": "Mismatched elements: 1 / 4"},
        {"name": "test_d", "op": "D", "status": "skip", "reason": "training op"},
    ]
    assert counts(results) == {"pass": 1, "fail": 1, "error": 1, "crash": 0, "skip": 1}
    assert cause(results[1]) == "unsupported ops: Bar, Foo"
    path = tmp_path / "expected.yaml"
    assert write_expected(results, path, "1.0", carried={"test_z": ("old cause", "Z")}) == 3
    listed = load_expected(path)
    assert listed == {"test_b": "unsupported ops: Bar, Foo",
                      "test_c": "wrong values (beyond rtol/atol)", "test_z": "old cause"}
    assert compare_expected(results, listed).ok
    now = [{**results[0], "status": "error", "reason": "boom"},
           {**results[1], "status": "pass", "reason": ""}]
    comparison = compare_expected(now, listed, suite=["test_a", "test_b", "test_c"])
    assert comparison.unexpected_failures == [("test_a", "boom")]
    assert comparison.unexpected_passes == ["test_b"]
    assert comparison.unknown == ["test_z"] and not comparison.ok
    assert "now pass" in comparison.text() and "not on the expected list" in comparison.text()
