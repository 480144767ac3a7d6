"""Every op the CUDA target compiles, on the same awkward shapes as the CPU op tests:
the one-node model is compiled for cuda (nvcc builds the cubin: a ptxas error fails
the test), the artifact's CUDA source runs in the emulator, sanitized (every output
element written, the same bits with blocks and threads reversed, no write into a red
zone), and the outputs match the numpy reference interpreter and ONNX Runtime (f32
tolerance 1e-4 norm-wise)."""
from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from helpers.onnx_util import bitcast_model, one_node_model
from helpers.op_cases import CASES, N_OUTPUTS

import hidetc
from hidetc.driver.verify import compare, run_onnxruntime
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.reference import run_graph

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_cuda_emulated(case, tmp_path):
    op, inputs, attrs, constants = CASES[case]
    outputs = [f"out{i}" for i in range(N_OUTPUTS.get(case, 1))]
    path = tmp_path / "model.onnx"
    onnx.save(one_node_model(op, inputs, outputs, attrs, constants), path)
    hidetc.compile_model(path, tmp_path / "out", target="cuda", arch="sm_90")
    got = hidetc.load(tmp_path / "out", emulate=True, sanitize=True).run(inputs)
    expected = run_graph(load_model(path), inputs)
    for name in outputs:
        assert got[name].dtype == expected[name].dtype
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5)
    assert compare(got, run_onnxruntime(path, inputs), rtol=1e-4)["status"] == "passed"


@pytest.mark.parametrize("src,dst,values", [
    ("float32", "int32", [0.0, -0.0, 1.5, -np.inf, np.nan, 1e-45]),
    ("int32", "float32", [0, -1, 0x3FC00000, 0x7F800001, -2**31]),
    ("float64", "uint64", [0.0, -0.0, 2.5, np.inf, np.nan]),
    ("float16", "int16", [0.0, -0.0, 1.5, -np.inf, 6e-8]),
    ("uint16", "float16", [0, 0x8000, 0x7C00, 0x3C00, 1]),
    ("int8", "uint8", [-128, -1, 0, 127])])
def test_bitcast_cuda_emulated(src, dst, values, tmp_path):
    """BitCast-26 in CUDA C (__float_as_uint, __double_as_longlong, __half_as_ushort and
    back): nvcc builds it, the emulator runs it, bit for bit the numpy view."""
    x = np.array(values).astype(src).reshape(1, -1)
    path = tmp_path / "model.onnx"
    onnx.save(bitcast_model(x, dst), path)
    hidetc.compile_model(path, tmp_path / "out", target="cuda", arch="sm_90")
    got = hidetc.load(tmp_path / "out", emulate=True, sanitize=True).run({"x": x})["out0"]
    assert got.dtype == np.dtype(dst) and got.tobytes() == x.view(dst).tobytes()


def test_det_cuda_emulated(tmp_path):
    """Det (elimination with partial pivoting, unrolled into catalogue ops) through nvcc
    and the emulator: numpy's determinants, a zero first pivot and a singular matrix
    included."""
    x = np.random.default_rng(3).standard_normal((4, 3, 3)).astype(np.float32)
    x[1, 0, 0] = 0.0
    x[2] = [[1, 2, 3], [2, 4, 6], [0, 1, 1]]
    path = tmp_path / "model.onnx"
    onnx.save(one_node_model("Det", {"x": x}, ["out0"], opset=13), path)
    hidetc.compile_model(path, tmp_path / "out", target="cuda", arch="sm_90")
    got = hidetc.load(tmp_path / "out", emulate=True, sanitize=True).run({"x": x})["out0"]
    np.testing.assert_allclose(got, np.linalg.det(x.astype(np.float64)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_roi_align_cuda_emulated(mode, tmp_path):
    """RoiAlign's compute definition in CUDA C (float64 coordinates, 16 corner loads
    per output at sampling_ratio 2): nvcc builds it, the emulator runs it, ONNX Runtime's
    values (boxes off the image and an empty one included)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 3, 7, 9)).astype(np.float32)
    corners = rng.uniform(-3, 11, (6, 2, 2))
    rois = np.concatenate([corners.min(1), corners.max(1)], axis=1).astype(np.float32)
    rois[0] = [1.0, 1.0, 1.0, 1.0]
    rois[1] = [-9.0, -9.0, -4.0, -2.0]
    inputs = {"x": x, "rois": rois, "b": rng.integers(0, 2, 6).astype(np.int64)}
    path = tmp_path / "model.onnx"
    onnx.save(one_node_model("RoiAlign", inputs, ["out0"],
                             {"mode": mode, "output_height": 3, "output_width": 2,
                              "sampling_ratio": 2, "spatial_scale": 0.5}, opset=16), path)
    hidetc.compile_model(path, tmp_path / "out", target="cuda", arch="sm_90")
    got = hidetc.load(tmp_path / "out", emulate=True, sanitize=True).run(inputs)["out0"]
    np.testing.assert_allclose(got, run_onnxruntime(path, inputs)["out0"], rtol=1e-5,
                               atol=1e-5)
