"""Every op the CPU target compiles, end to end: a one-node ONNX model is compiled with
hidetc (which verifies against ONNX Runtime at the f32 tolerance, 1e-4 norm-wise) and
the artifact's outputs are also checked against our numpy reference interpreter.
Shapes are awkward on purpose: 1, primes, broadcasts."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from helpers.onnx_util import one_node_model
from helpers.op_cases import CASES, N_OUTPUTS

import hidetc
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.reference import run_graph


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_compiles_and_matches(case, tmp_path):
    op, inputs, attrs, constants = CASES[case]
    outputs = [f"out{i}" for i in range(N_OUTPUTS.get(case, 1))]
    model = one_node_model(op, inputs, outputs, attrs, constants)
    path = tmp_path / "model.onnx"
    onnx.save(model, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    assert result.manifest["verification"]["status"] == "passed"
    got = hidetc.load(tmp_path / "out").run(inputs)
    expected = run_graph(load_model(path), inputs)
    for name in outputs:
        assert got[name].dtype == expected[name].dtype
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)


def test_constant_conv_weights_are_packed_at_compile_time(tmp_path):
    """A Conv's constant weights reach its kernel pre-packed (only the packed copy is
    stored); weights given as a graph input are read as they come."""
    for case, packed in (("conv_ragged", True), ("conv_weights_input", False)):
        op, inputs, attrs, constants = CASES[case]
        path = tmp_path / f"{case}.onnx"
        onnx.save(one_node_model(op, inputs, ["out0"], attrs, constants), path)
        result = hidetc.compile_model(path, tmp_path / case, target="cpu")
        (kernel,) = [k for k in result.manifest["kernels"] if k["op"] == "Conv"]
        weight = kernel["args"][1]
        assert weight.startswith("w.packed_mr") == packed, kernel["args"]
        stored = set(result.manifest["weights"]["entries"])
        assert ("w" in stored) == (not packed and "w" in constants), stored
        got = hidetc.load(tmp_path / case).run(inputs)["out0"]
        expected = run_graph(load_model(path), inputs)["out0"]
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
