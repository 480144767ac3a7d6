"""Tensors past int32 indexing and past the machine (issue 27 item 6), and launches too
small to share (the other end of the scale): the cpu kernels
index them in int64 (a loop over 2^31 + 64 elements gets an int64 variable; a slow
test runs one), the cuda kernels refuse them at plan time naming the node, and a model
whose tensors cannot fit this machine's memory is refused before tuning or verifying
it here -- one line each, never a hang."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import hidetc
import models
from hidetc.errors import ConfigError, UnsupportedOpError
from hidetc.schedules.cpu import SERIAL_WORK

BIG = 2 ** 31 + 64


def _unary(op: str, n: int, elem=TensorProto.BOOL, path=None):
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], name="n0")], "g",
                              [helper.make_tensor_value_info("x", elem, [n])],
                              [helper.make_tensor_value_info("y", elem, [n])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    models.save(proto, path)
    return path


def test_cpu_kernels_index_past_int32_in_int64(tmp_path):
    path = _unary("Not", BIG, path=tmp_path / "m.onnx")
    hidetc.compile_model(path, tmp_path / "out", target="cpu", tune=False, verify=False)
    (source,) = [p.read_text() for p in (tmp_path / "out" / "kernels" / "src").glob("not_*.c")]
    assert "int64_t" in source and str(BIG) in source


def test_cuda_refuses_tensors_past_its_int32_offsets(tmp_path):
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    path = _unary("Not", BIG, path=tmp_path / "m.onnx")
    with pytest.raises(UnsupportedOpError, match=r"node 'n0' \(Not\): 'x' has 2147483712 "
                                                 r"elements .*cuda kernels index at most"):
        hidetc.compile_model(path, tmp_path / "out", target="cuda", arch="sm_90")
    assert not (tmp_path / "out").exists()


def test_a_model_past_this_machines_memory_is_refused_before_running_it(tmp_path):
    """2^40 x 4 floats (16 TiB): refused at once when tuning or verification would run
    it here; with both off it builds (for a bigger machine), in well under a minute."""
    elem = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", elem, [2 ** 40, 4])],
                              [helper.make_tensor_value_info("y", elem, [2 ** 40, 4])])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    models.save(proto, tmp_path / "m.onnx")
    with pytest.raises(ConfigError, match=r"the model's tensors need at least 32,768\.0 GiB "
                                          r".* compile with --no-tune --no-verify"):
        hidetc.compile_model(tmp_path / "m.onnx", tmp_path / "out", target="cpu")
    hidetc.compile_model(tmp_path / "m.onnx", tmp_path / "out", target="cpu", tune=False,
                         verify=False)


@pytest.mark.slow
def test_cpu_runs_a_tensor_past_int32_indexing(tmp_path):
    """4 GiB of memory: a Not over 2^31 + 64 booleans, every element checked."""
    path = _unary("Not", BIG, path=tmp_path / "m.onnx")
    hidetc.compile_model(path, tmp_path / "out", target="cpu", tune=False, verify=False)
    x = np.zeros(BIG, bool)
    x[::3] = True
    x[-5:] = True
    y = hidetc.load(tmp_path / "out").run({"x": x})["y"]
    assert np.array_equal(y, ~x)


def _matmul(m: int, k: int, n: int, path):
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                              [numpy_helper.from_array(w, "w")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    models.save(proto, path)
    return path


def test_launches_too_small_to_share_run_on_the_calling_thread(tmp_path):
    """A kernel whose anchor does less than SERIAL_WORK prints its parallel loops as
    plain loops (no fork and join per launch); a big one keeps its parallel region. Each
    computes what ONNX Runtime does (the compile verifies)."""
    def source(shape, cores):
        out = tmp_path / f"out{'x'.join(map(str, shape))}c{cores}"
        hidetc.compile_model(_matmul(*shape, tmp_path / f"{out.name}.onnx"), out,
                             target="cpu", tune=False, cpu_cores=cores)
        (text,) = [p.read_text() for p in (out / "kernels" / "src").glob("matmul_*.c")]
        return text
    small, big = (2, 16, 8), (64, 256, 256)
    assert 2 * 2 * 16 * 8 < SERIAL_WORK < 2 * 64 * 256 * 256
    assert "#pragma omp parallel" not in source(small, 2)
    assert "#pragma omp parallel" in source(big, 2)
