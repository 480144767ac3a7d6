"""`compute_bf16` (the cpu's `--precision bf16`): which anchors compute their products in
bf16, that nothing else changes, and that the marked graph's reference stays within the
bf16 tolerance of the f32 one. End to end (where this CPU has AVX512_BF16): a model with
attention-like batched products, a residual, normalization and convolutions compiles in
bf16, verifies against ONNX Runtime, stores its weights as bf16 and records the
features its kernels use."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from graph.test_float16 import build
from onnx import TensorProto, helper, numpy_helper

import hidetc
from hidetc import cpu_isa
from hidetc.driver import api
from hidetc.driver.config import TOLERANCES, CompileConfig
from hidetc.graph.ir import Node, TensorType
from hidetc.graph.passes import compute_bf16
from hidetc.graph.reference import run_graph

RNG = np.random.default_rng(3)
F32 = "float32"


def norm_error(got, want) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def graph_of_anchors():
    consts = {"w": RNG.standard_normal((32, 24)).astype(np.float32),
              "k": RNG.standard_normal((8, 16, 3, 3)).astype(np.float32),
              "kg": RNG.standard_normal((16, 4, 3, 3)).astype(np.float32),
              "k3": RNG.standard_normal((16, 3, 3, 3)).astype(np.float32)}
    nodes = [Node.make("MatMul", ["x", "w"], ["y"], name="mm"),
             Node.make("Conv", ["img", "k"], ["c1"], name="conv", pads=[1, 1, 1, 1]),
             Node.make("Conv", ["c1x", "kg"], ["c2"], name="grouped", group=4,
                       pads=[1, 1, 1, 1]),
             Node.make("Conv", ["rgb", "k3"], ["c3"], name="stem", pads=[1, 1, 1, 1]),
             Node.make("Relu", ["y"], ["r"], name="relu")]
    inputs = {"x": TensorType(F32, (5, 32)), "img": TensorType(F32, (1, 16, 6, 6)),
              "c1x": TensorType(F32, (1, 16, 6, 6)), "rgb": TensorType(F32, (1, 3, 6, 6))}
    return build(inputs, consts, nodes, ["r", "c1", "c2", "c3"])


def test_the_gemm_anchors_are_marked_and_nothing_else():
    graph = graph_of_anchors()
    marked = {n.name: compute_bf16.computes_bf16(n) for n in compute_bf16.run(graph).nodes}
    # grouped convs and a 3-channel stem stay f32 (MIN_CHANNELS); elementwise untouched
    assert marked == {"mm": True, "conv": True, "grouped": False, "stem": False,
                      "relu": False}
    kept = compute_bf16.run(graph, keep_f32={"mm"})
    assert not compute_bf16.computes_bf16(kept.nodes[0])
    assert compute_bf16.run(compute_bf16.run(graph)).nodes == compute_bf16.run(graph).nodes


def test_half_typed_anchors_are_not_marked():
    graph = build({"a": TensorType("float16", (4, 8)), "b": TensorType("float16", (8, 2))},
                  {}, [Node.make("MatMul", ["a", "b"], ["y"], name="mm")], ["y"])
    assert compute_bf16.run(graph) is graph


def test_the_marked_reference_is_within_the_bf16_tolerance():
    graph = graph_of_anchors()
    feeds = {name: RNG.standard_normal(graph.types[name].shape).astype(np.float32)
             for name in graph.inputs}
    want = run_graph(graph, feeds)
    got = run_graph(compute_bf16.run(graph), feeds)
    for name in graph.outputs:
        err = norm_error(got[name], want[name])
        if name in ("r", "c1"):
            assert 0 < err <= TOLERANCES["bf16"] / 4, name
        else:
            assert err == 0, name      # not marked: the f32 result exactly


def small_transformer(path):
    """x [n, 64] -> q, k, v projections -> softmax(q k^T) v -> + x -> LayerNorm ->
    a 1x1 and a 3x3 conv of its reshape: every anchor kind the bf16 path builds."""
    make = helper.make_node
    w = {n: (RNG.standard_normal((64, 64)) * 0.125).astype(np.float32)
         for n in ("wq", "wk", "wv")}
    w["k1"] = (RNG.standard_normal((32, 16, 1, 1)) * 0.25).astype(np.float32)
    w["k3"] = (RNG.standard_normal((16, 32, 3, 3)) * 0.06).astype(np.float32)
    w["g"], w["b"] = np.ones(64, np.float32), np.zeros(64, np.float32)
    w["shape"] = np.array([1, 16, 4, 16], np.int64)
    nodes = [make("MatMul", ["x", "wq"], ["q"]), make("MatMul", ["x", "wk"], ["k"]),
             make("MatMul", ["x", "wv"], ["v"]), make("Transpose", ["k"], ["kt"]),
             make("MatMul", ["q", "kt"], ["s"]), make("Softmax", ["s"], ["p"], axis=-1),
             make("MatMul", ["p", "v"], ["o"]), make("Add", ["o", "x"], ["res"]),
             make("LayerNormalization", ["res", "g", "b"], ["ln"], axis=-1),
             make("Reshape", ["ln", "shape"], ["img"]),
             make("Conv", ["img", "k1"], ["c1"]), make("Relu", ["c1"], ["r1"]),
             make("Conv", ["r1", "k3"], ["y"], pads=[1, 1, 1, 1])]
    graph = helper.make_graph(
        nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in w.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


@pytest.mark.skipif(cpu_isa.BF16 not in cpu_isa.host_features(),
                    reason="this CPU lacks AVX512_BF16")
def test_a_small_transformer_compiles_and_verifies_in_bf16(tmp_path):
    model = small_transformer(tmp_path / "t.onnx")
    out = tmp_path / "out"
    result = api.compile_model(model, out, config=CompileConfig(
        target="cpu", precision="bf16", tune=False))
    check = result.manifest["verification"]
    assert check["status"] == "passed"
    assert all(0 < o["rel_error"] <= TOLERANCES["bf16"] for o in check["outputs"].values())
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert manifest["precision"] == "bf16"
    assert manifest["cpu_features"] == list(cpu_isa.bf16_features(cpu_isa.host_features()))
    packed = {k: v for k, v in manifest["weights"]["entries"].items() if k.endswith("bf16")}
    # 3 projections, 2 convs; the batched products pack their operands at run time
    assert len(packed) == 5 and all(v["dtype"] == "bfloat16" for v in packed.values())
    x = RNG.standard_normal((16, 64)).astype(np.float32)
    loaded = hidetc.load(out)
    (y,) = loaded.run({"x": x}).values()
    (want,) = ort.InferenceSession(str(model)).run(None, {"x": x})
    assert 0 < norm_error(y, want) <= TOLERANCES["bf16"]
    # one loaded model from several threads (each OpenMP team loads its own AMX tile
    # configuration per call): the single-threaded results bit for bit
    xs = [RNG.standard_normal((16, 64)).astype(np.float32) for _ in range(8)]
    alone = [loaded.run({"x": xi})["y"] for xi in xs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(lambda xi: loaded.run({"x": xi})["y"], xs * 3))
    for i, got in enumerate(together):
        np.testing.assert_array_equal(got, alone[i % len(xs)])


@pytest.mark.skipif(cpu_isa.BF16 not in cpu_isa.host_features(),
                    reason="this CPU lacks AVX512_BF16")
def test_a_bf16_compile_over_its_tolerance_falls_back_to_f32_per_node(tmp_path):
    """rtol 1e-3 is below what bf16 products give this model (~2e-3): the recovery
    recompiles its costliest bf16 nodes in f32, worst first, until it verifies, and
    records them; `keep_f32` names such nodes up front."""
    model = small_transformer(tmp_path / "t.onnx")
    result = api.compile_model(model, tmp_path / "out", config=CompileConfig(
        target="cpu", precision="bf16", tune=False, rtol=1e-3))
    check = result.manifest["verification"]
    assert check["status"] == "passed"
    recovery = check["recovery"]
    assert "tolerance 0.001" in recovery["first_failure"] and recovery["f32"]
    errors = [n["bf16_error"] for n in recovery["f32"]]
    assert errors == sorted(errors, reverse=True) and errors[0] > recovery["share"]
    kept = [n["node"] for n in recovery["f32"]]
    graph_f32 = api.compile_model(model, tmp_path / "kept", config=CompileConfig(
        target="cpu", precision="bf16", tune=False, keep_f32=kept))
    templates = {k["node"]: k["template"] for k in graph_f32.manifest["kernels"]}
    assert all(templates[n] in ("cpu.matmul", "cpu.conv") for n in kept), templates
    bf16 = [n for n, t in templates.items() if t.endswith(".bf16")]
    assert not set(bf16) & set(kept)
    assert "recovery" not in graph_f32.manifest["verification"]


def test_keep_f32_is_a_list_of_names():
    assert CompileConfig(keep_f32=["a", "b"]).keep_f32 == ("a", "b")
    with pytest.raises(Exception, match="keep_f32: expected a list of node names"):
        CompileConfig(keep_f32="a")


@pytest.mark.skipif(cpu_isa.BF16 not in cpu_isa.host_features(),
                    reason="this CPU lacks AVX512_BF16")
def test_a_range_of_sizes_in_bf16(tmp_path):
    """Symbolic M (the bf16 kernels' extents are expressions): one artifact for n in
    1..70, verified at the range's sizes, and run at sizes between them."""
    make = helper.make_node
    w1 = (RNG.standard_normal((40, 72)) * 0.2).astype(np.float32)
    w2 = (RNG.standard_normal((72, 33)) * 0.2).astype(np.float32)
    graph = helper.make_graph(
        [make("MatMul", ["x", "w1"], ["h"]), make("Relu", ["h"], ["r"]),
         make("MatMul", ["r", "w2"], ["y"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 33])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp_path / "m.onnx")
    result = api.compile_model(tmp_path / "m.onnx", tmp_path / "out", config=CompileConfig(
        target="cpu", precision="bf16", tune=False, dims={"n": "1..70"}))
    assert result.manifest["verification"]["status"] == "passed"
    loaded = hidetc.load(tmp_path / "out")
    for n in (1, 17, 33, 70):
        x = RNG.standard_normal((n, 40)).astype(np.float32)
        (y,) = loaded.run({"x": x}).values()
        want = np.maximum(x @ w1, 0) @ w2
        assert y.shape == (n, 33) and norm_error(y, want) <= TOLERANCES["bf16"]
