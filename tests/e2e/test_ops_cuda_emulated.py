"""Every op the CUDA target compiles, on the same awkward shapes as the CPU op tests:
the one-node model is compiled for cuda (nvcc builds the cubin: a ptxas error fails
the test), the artifact's CUDA source runs in the emulator, and the outputs match the
numpy reference interpreter and ONNX Runtime (f32 tolerance 1e-4 norm-wise)."""
from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from helpers.onnx_util import one_node_model
from helpers.op_cases import CASES, N_OUTPUTS

import hidetc
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.reference import run_graph
from hidetc.verify import compare, run_onnxruntime

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_cuda_emulated(case, tmp_path):
    op, inputs, attrs, constants = CASES[case]
    outputs = [f"out{i}" for i in range(N_OUTPUTS.get(case, 1))]
    path = tmp_path / "model.onnx"
    onnx.save(one_node_model(op, inputs, outputs, attrs, constants), path)
    hidetc.compile_model(path, tmp_path / "out", target="cuda", arch="sm_90")
    got = hidetc.load(tmp_path / "out", emulate=True).run(inputs)
    expected = run_graph(load_model(path), inputs)
    for name in outputs:
        assert got[name].dtype == expected[name].dtype
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)
    assert compare(got, run_onnxruntime(path, inputs), rtol=1e-4)["status"] == "passed"
