"""Reshapes in a fusion group are views of the same row-major memory: grafted into a
MatMul's loads (a prologue Reshape of a materialized value) and stores (epilogue, with
a residual Add after them) they read and write through buffers of the kernel's own
[rows, cols] view, with no index division per element; a Transpose still maps the
index. (A Reshape of a value computed by another prologue still goes through the
logical index.) Checked on the grafted
kernel's parameters and the group's numerics (the compile verifies against ONNX
Runtime)."""
from __future__ import annotations

import numpy as np
import onnx
from helpers import targets
from helpers.fusion_graphs import const, model, target_graph

import hidetc
from hidetc.driver.context import plan_graph


def _proto(transpose: bool) -> onnx.ModelProto:
    nodes = [
        ("Reshape", ["x", "rows"], ["a"], {}),                 # [1, 4, 6, 8] -> [24, 8]
        ("MatMul", ["a", "w"], ["m"], {}),
        ("Reshape", ["m", "back"], ["m4"], {}),                # -> [1, 4, 6, 8]
        ("Add", ["m4", "x"], ["s"], {}),
        ("Relu", ["s"], ["y"], {}),
    ]
    if transpose:      # [24, 8] -> [8, 24] -> [1, 4, 6, 8]: a different element order
        nodes[2:3] = [("Transpose", ["m"], ["mt"], {"perm": [1, 0]}),
                      ("Reshape", ["mt", "back"], ["m4"], {})]
    consts = {"rows": np.array([24, 8], np.int64), "w": const((8, 8)),
              "back": np.array([1, 4, 6, 8], np.int64)}
    return model(nodes, {"x": [1, 4, 6, 8]}, ["y"], consts)


def _matmul_params(proto) -> list[tuple[int, ...]]:
    plan = plan_graph(target_graph(proto, targets.CPU), targets.CPU)
    (record,) = [r for r in plan.launches if r.group.anchor.endswith("MatMul")]
    return [tuple(p.shape) for p in record.function.params if hasattr(p, "shape")]


def test_reshapes_read_and_write_through_the_kernel_view(tmp_path):
    proto = _proto(transpose=False)
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    result = hidetc.compile_model(path, tmp_path / "out", target="cpu")
    (mm,) = [k for k in result.manifest["kernels"] if k["op"] == "MatMul"]
    assert [op for _, op in mm["group"]["prologues"]] == ["Reshape"]
    assert [op for _, op in mm["group"]["epilogues"]] == ["Reshape", "Add", "Relu"]
    # x read twice (the Reshape prologue, the residual) and y written: all as [24, 8]
    shapes = _matmul_params(proto)
    assert (1, 4, 6, 8) not in shapes and shapes.count((24, 8)) >= 2, shapes


def test_a_transpose_still_maps_the_index(tmp_path):
    proto = _proto(transpose=True)
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    hidetc.compile_model(path, tmp_path / "out", target="cpu")     # verifies vs ORT
    assert (1, 4, 6, 8) in _matmul_params(proto)


def test_a_reshape_to_a_scalar_is_read_as_a_scalar(tmp_path):
    """DequantizeLinear's decomposition reshapes a [1] zero point to a scalar, which a
    Sub prologue reads: the view buffer has rank 0 (not the source's [1]), else the
    kernel failed its IR check (every QLinear/DequantizeLinear node test did)."""
    nodes = [("Reshape", ["zp", "scalar"], ["z"], {}),
             ("Sub", ["x", "z"], ["d"], {}),
             ("Mul", ["d", "scale"], ["y"], {})]
    consts = {"scalar": np.zeros(0, np.int64), "scale": np.array(0.5, np.float32)}
    proto = model(nodes, {"x": [5], "zp": [1]}, ["y"], consts)
    path = tmp_path / "m.onnx"
    onnx.save(proto, path)
    hidetc.compile_model(path, tmp_path / "out", target="cpu")    # verifies vs ORT
    x, zp = np.arange(5, dtype=np.float32), np.array([2.0], np.float32)
    got = hidetc.load(tmp_path / "out").run({"x": x, "zp": zp})["y"]
    np.testing.assert_allclose(got, (x - 2.0) * 0.5, rtol=1e-6)
