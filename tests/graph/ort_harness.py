"""Test helper: build a one-node ONNX model, run it in ONNX Runtime and through our
importer + numpy reference interpreter, and compare.

Imported by the op tests as `tests.graph.ort_harness` (pytest's pythonpath is the repo root).
Inputs listed in `consts` (default: the op's `value_inputs`) become initializers, so
shape inference sees their values; the others are graph inputs fed at run time.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper

from hidetc.frontend.onnx import import_model
from hidetc.graph.ops import REGISTRY
from hidetc.graph.reference import run_graph

ORT_OPTIONS = ort.SessionOptions()
ORT_OPTIONS.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
ORT_OPTIONS.intra_op_num_threads = 1
ORT_OPTIONS.log_severity_level = 3


def one_node_model(op: str, inputs: Sequence[np.ndarray | None], attrs: dict | None = None,
                   consts: Sequence[int] = (), outputs: int = 1, opset: int = 21,
                   domain: str = "") -> onnx.ModelProto:
    names = ["" if x is None else f"x{i}" for i, x in enumerate(inputs)]
    out_names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, out_names, name=f"the_{op}", domain=domain,
                            **(attrs or {}))
    graph_inputs, initializers = [], []
    for i, x in enumerate(inputs):
        if x is None:
            continue
        if i in consts:
            initializers.append(onnx.numpy_helper.from_array(x, names[i]))
        else:
            elem = helper.np_dtype_to_tensor_dtype(x.dtype)
            graph_inputs.append(helper.make_tensor_value_info(names[i], elem, x.shape))
    graph = helper.make_graph([node], f"test_{op}", graph_inputs,
                              [helper.make_empty_tensor_value_info(n) for n in out_names],
                              initializers)
    opsets = [helper.make_opsetid("", opset)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), ORT_OPTIONS,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def run_ours(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    graph = import_model(model)
    results = run_graph(graph, feeds)
    for name, value in results.items():
        assert graph.types[name].shape == value.shape
    return [results[name] for name in graph.outputs]


def assert_same(ours: np.ndarray, theirs: np.ndarray, rtol: float, atol: float,
                what: str = "") -> None:
    assert ours.dtype == theirs.dtype, f"{what}: dtype {ours.dtype} vs ORT {theirs.dtype}"
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape} vs ORT {theirs.shape}"
    if ours.dtype.kind in "fc":
        np.testing.assert_allclose(ours, theirs, rtol=rtol, atol=atol, equal_nan=True,
                                   err_msg=what)
    else:
        np.testing.assert_array_equal(ours, theirs, err_msg=what)


def check_op(op: str, inputs: Sequence[np.ndarray | None], attrs: dict | None = None, *,
             consts: Sequence[int] | None = None, outputs: int = 1, opset: int = 21,
             rtol: float = 1e-5, atol: float = 1e-6) -> list[np.ndarray]:
    """Compare our importer + reference with ONNX Runtime on one node; return ours."""
    consts = REGISTRY[op].value_inputs if consts is None and op in REGISTRY else (consts or ())
    model = one_node_model(op, inputs, attrs, consts, outputs, opset)
    feeds = {f"x{i}": x for i, x in enumerate(inputs) if x is not None and i not in consts}
    theirs = run_ort(model, feeds)
    ours = run_ours(model, feeds)
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_same(a, b, rtol, atol, f"{op} output {i}")
    return ours


def rand(*shape: int, dtype: Any = np.float32, low: float = -2.0, high: float = 2.0,
         seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed + 7919 * len(shape) + sum(shape))
    if np.dtype(dtype).kind in "iu":
        return rng.integers(int(low), int(high) + 1, size=shape).astype(dtype)
    if np.dtype(dtype) == np.bool_:
        return rng.random(shape) < 0.5
    return rng.uniform(low, high, size=shape).astype(dtype)
