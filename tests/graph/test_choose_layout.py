"""The layout pass (hidetc/graph/passes/choose_layout.py): on a small ResNet-like graph
(stem conv + relu + maxpool, a basic block with a 1x1 projection, a per-channel affine
(a lowered BN), a strided second block, GAP + Reshape + MatMul head) the rewritten
graph verifies, computes what the original computes (numpy reference, float32 and
float16), keeps the NHWC chain between convolutions through the pools (transposes only
at the input, before the head's Reshape and at NCHW graph outputs), sends depthwise
convs on multiples of 8 channels NHWC on cuda f16, leaves C/G % 8 != 0 there and the
f32 cuda / f16 cpu graphs alone; the cpu f32 policy and an Inception-like block (concat
and pools) on both targets.
"""
from __future__ import annotations

import numpy as np
import pytest

from hidetc.driver.backend import BACKENDS
from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.graph.passes import choose_layout
from hidetc.graph.reference import run_graph
from hidetc.graph.verify import propagate_values, verify_graph

N = Node.make


def build(inputs: dict, nodes: list[Node], outputs: list[str], constants: dict) -> Graph:
    types = {name: TensorType(dtype, tuple(shape)) for name, (dtype, shape) in inputs.items()}
    types.update({name: TensorType.of(array) for name, array in constants.items()})
    values = dict(constants)
    for node in nodes:
        inferred = infer_node(node, [types[v] if v else None for v in node.inputs],
                              [values.get(v) if v else None for v in node.inputs])
        types.update((o, t) for o, t in zip(node.outputs, inferred) if o)
        propagate_values(node, types, values)
    graph = Graph(tuple(inputs), tuple(outputs), tuple(nodes), types, constants)
    verify_graph(graph)
    return graph


def resnet_like(dtype: str, extra_outputs=()) -> Graph:
    rng = np.random.default_rng(0)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(dtype)

    constants = {
        "w0": w(16, 16, 3, 3), "b0": w(16), "w1": w(16, 16, 3, 3), "w2": w(32, 16, 3, 3),
        "b2": w(32), "w3": w(32, 16, 1, 1), "scale": w(32, 1, 1) + 1, "shift": w(32, 1, 1),
        "w4": w(32, 32, 3, 3), "b4": w(32), "half": np.array(0.5, dtype),
        "lo": np.array(0, dtype), "hi": np.array(6, dtype), "fc": w(32, 10),
        "shape": np.array([1, 32], np.int64),
    }
    nodes = [
        N("Conv", ["x", "w0", "b0"], ["c0"], pads=(1, 1, 1, 1)),
        N("Relu", ["c0"], ["r0"]),
        N("MaxPool", ["r0"], ["p0"], kernel_shape=(2, 2), strides=(2, 2)),
        N("Conv", ["p0", "w1"], ["c1"], auto_pad="SAME_UPPER"),
        N("Relu", ["c1"], ["r1"]),
        N("Conv", ["r1", "w2", "b2"], ["c2"], pads=(1, 1, 1, 1)),
        N("Conv", ["p0", "w3"], ["c3"]),
        N("Add", ["c2", "c3"], ["a"]),
        N("Mul", ["a", "scale"], ["s"]),
        N("Add", ["shift", "s"], ["t"]),
        N("Relu", ["t"], ["r2"]),
        N("Conv", ["r2", "w4", "b4"], ["c4"], pads=(1, 0, 1, 2), strides=(2, 2)),
        N("Clip", ["c4", "lo", "hi"], ["r4"]),
        N("Mul", ["r4", "half"], ["h"]),
        N("GlobalAveragePool", ["h"], ["g"]),
        N("Reshape", ["g", "shape"], ["flat"]),
        N("MatMul", ["flat", "fc"], ["logits"]),
    ]
    return build({"x": (dtype, (1, 16, 8, 8))}, nodes, ["logits", *extra_outputs], constants)


def mixed(dtype: str) -> Graph:
    """An RGB stem (C = 3), a depthwise conv (C/G = 1), a grouped conv with C/G = 4:
    all stay NCHW; a 1x1 conv with C = 16 goes NHWC."""
    rng = np.random.default_rng(1)
    constants = {"ws": rng.standard_normal((16, 3, 3, 3)).astype(dtype),
                 "wd": rng.standard_normal((16, 1, 3, 3)).astype(dtype),
                 "wg": rng.standard_normal((16, 4, 1, 1)).astype(dtype),
                 "wp": rng.standard_normal((24, 16, 1, 1)).astype(dtype)}
    nodes = [
        N("Conv", ["x", "ws"], ["c0"], pads=(1, 1, 1, 1), strides=(2, 2)),
        N("Relu", ["c0"], ["r0"]),
        N("Conv", ["r0", "wd"], ["c1"], pads=(1, 1, 1, 1), group=16),
        N("Conv", ["c1", "wg"], ["c2"], group=4),
        N("Conv", ["c2", "wp"], ["c3"]),
        N("Sigmoid", ["c3"], ["y"]),
    ]
    return build({"x": (dtype, (1, 3, 9, 9))}, nodes, ["y"], constants)


def feeds(graph: Graph) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    return {name: rng.standard_normal(graph.types[name].shape).astype(graph.types[name].dtype)
            for name in graph.inputs}


def assert_same(before: Graph, after: Graph) -> None:
    """The same outputs. The NHWC reference is the NCHW one between exact transposes,
    but the im2col matmul sees its operands with other strides, so BLAS may sum in
    another order: f32 differences of a few ulps, which an f16 result can round across
    (one f16 ulp, 2^-10 relative, 2^-14 absolute near zero, propagated through the
    following layers)."""
    inputs = feeds(before)
    want, got = run_graph(before, inputs), run_graph(after, inputs)
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and got[name].shape == want[name].shape
        tol = 1e-5 if want[name].dtype == np.float32 else 1e-2
        np.testing.assert_allclose(got[name].astype(np.float64),
                                   want[name].astype(np.float64), rtol=tol, atol=tol)


def count(graph: Graph, op: str) -> int:
    return graph.op_counts().get(op, 0)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_resnet_block_stays_nhwc(dtype):
    before = resnet_like(dtype)
    after = choose_layout.run(before, choose_layout.wants_nhwc)
    verify_graph(after)
    assert_same(before, after)
    assert count(after, "Conv") == 0 and count(after, "ConvNHWC") == 5
    assert count(after, "MaxPoolNHWC") == 1 and count(after, "ReduceMean") == 1
    # x -> NHWC; the pooled [1, 1, 1, 32] -> NCHW for the Reshape: nothing else
    assert count(after, "Transpose") == 2
    for node in after.nodes:       # the elementwise ops run on NHWC values
        if node.op in ("Relu", "Add", "Mul", "Clip"):
            assert after.types[node.outputs[0]].shape[-1] in (16, 32)
    for node in after.nodes:
        if node.op == "ConvNHWC":
            assert after.types[node.inputs[1]].shape[1:3] in ((3, 3), (1, 1))
    assert "w0" not in after.constants      # the OIHW weights are dropped
    assert after.inputs == before.inputs and after.outputs == before.outputs


def test_graph_outputs_keep_their_names_and_layout():
    before = resnet_like("float32", extra_outputs=("r2", "c0"))
    after = choose_layout.run(before, choose_layout.wants_nhwc)
    verify_graph(after)
    assert_same(before, after)
    assert after.outputs == before.outputs
    assert all(after.types[o] == before.types[o] for o in before.outputs)
    assert count(after, "Transpose") == 4   # + r2 and c0 materialized in NCHW


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_depthwise_goes_nhwc_narrow_channels_stay_nchw(dtype):
    before = mixed(dtype)
    after = choose_layout.run(before, choose_layout.wants_nhwc)
    verify_graph(after)
    assert_same(before, after)
    assert count(after, "Conv") == 2 and count(after, "ConvNHWC") == 2
    (dw,) = [n for n in after.nodes if n.op == "ConvNHWC" and n.attr("group") == 16]
    assert after.types[dw.inputs[1]].shape == (16, 3, 3, 1)
    # r0 -> NHWC (depthwise), -> NCHW (grouped C/G = 4), -> NHWC (1x1), y -> NCHW
    assert count(after, "Transpose") == 4
    assert [n.op for n in after.nodes][-1] == "Transpose"   # Sigmoid ran in NHWC
    narrow = build({"x": (dtype, (1, 12, 5, 5))},
                   [N("Conv", ["x", "w"], ["y"], pads=(1, 1, 1, 1), group=12)], ["y"],
                   {"w": np.ones((12, 1, 3, 3), dtype)})
    assert choose_layout.run(narrow, choose_layout.wants_nhwc) is narrow


def test_the_layout_policy_is_the_backends():
    """cuda f32 graphs stay NCHW (the SIMT GEMM is NCHW); cuda f16 and the cpu run the
    layout pass, each with its own policy."""
    def names(kind, precision):
        return [name for name, _ in BACKENDS[kind].graph_passes(precision)]
    assert "choose_layout" not in names("cuda", "f32")
    assert "choose_layout" in names("cuda", "f16") and "choose_layout" in names("cpu", "f32")
    graph = resnet_like("float32")
    assert choose_layout.run(graph, lambda g, n: False) is graph


def test_nothing_to_do_returns_the_same_graph():
    graph = build({"x": ("float32", (1, 3, 4, 4))}, [N("Relu", ["x"], ["y"])], ["y"], {})
    assert choose_layout.run(graph, choose_layout.wants_nhwc) is graph


def inception_like() -> Graph:
    """Branches (1x1, 1x1 -> 3x3, avg-pool -> 1x1, max-pool) concatenated on the
    channels, then a strided 3x3 and a global max pool."""
    rng = np.random.default_rng(3)

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)
    constants = {"w0": w(16, 8, 1, 1), "w1": w(8, 8, 1, 1), "w2": w(12, 8, 3, 3),
                 "w3": w(8, 8, 1, 1), "w4": w(16, 44, 3, 3)}
    nodes = [
        N("Conv", ["x", "w0"], ["b0"]),
        N("Conv", ["x", "w1"], ["b1a"]),
        N("Relu", ["b1a"], ["b1r"]),
        N("Conv", ["b1r", "w2"], ["b1"], pads=(1, 1, 1, 1)),
        N("AveragePool", ["x"], ["p2"], kernel_shape=(3, 3), pads=(1, 1, 1, 1),
          count_include_pad=0),
        N("Conv", ["p2", "w3"], ["b2"]),
        N("MaxPool", ["x"], ["b3"], kernel_shape=(3, 3), pads=(1, 1, 1, 1)),
        N("Concat", ["b0", "b1", "b2", "b3"], ["cat"], axis=1),
        N("Conv", ["cat", "w4"], ["y0"], strides=(2, 2)),
        N("GlobalMaxPool", ["y0"], ["y"]),
    ]
    return build({"x": ("float32", (1, 8, 9, 9))}, nodes, ["y"], constants)


def on_cpu(before: Graph) -> Graph:
    """The cpu layout pass's graph, checked: it verifies and computes what `before` does."""
    after = choose_layout.run(before, choose_layout.wants_nhwc_cpu)
    verify_graph(after)
    assert_same(before, after)
    return after


def test_cpu_resnet_block_stays_nhwc_through_pools():
    after = on_cpu(resnet_like("float32"))
    assert count(after, "Conv") == 0 and count(after, "ConvNHWC") == 5
    assert count(after, "MaxPoolNHWC") == 1 and count(after, "ReduceMean") == 1
    # x -> NHWC; the pooled [1, 1, 1, 32] -> NCHW for the Reshape: nothing else
    assert count(after, "Transpose") == 2


def test_cpu_depthwise_and_rgb_stem_go_nhwc_narrow_groups_stay():
    after = on_cpu(mixed("float32"))
    assert count(after, "Conv") == 1 and count(after, "ConvNHWC") == 3
    (dw,) = [n for n in after.nodes if n.op == "ConvNHWC" and n.attr("group") == 16]
    assert after.types[dw.inputs[1]].shape == (16, 3, 3, 1)
    # x -> NHWC (stem), -> NCHW (grouped C/G = 4), -> NHWC (1x1), y -> NCHW
    assert count(after, "Transpose") == 4


def test_cpu_inception_block_concat_and_pools_stay_nhwc():
    after = on_cpu(inception_like())
    assert count(after, "ConvNHWC") == 5
    assert count(after, "AveragePoolNHWC") == 1 and count(after, "MaxPoolNHWC") == 1
    (cat,) = [n for n in after.nodes if n.op == "Concat"]
    assert cat.attr("axis") == 3 and after.types[cat.outputs[0]].shape == (1, 9, 9, 44)
    assert count(after, "ReduceMax") == 1
    assert count(after, "Transpose") == 2      # x -> NHWC, y -> NCHW


def test_cuda_inception_block_concat_and_pools_stay_nhwc():
    """cuda f16: the same block; the strided 3x3 reads C = 44 (not a multiple of 8), so
    it stays NCHW and the NHWC concat is transposed once for it."""
    before = inception_like()
    after = choose_layout.run(before, choose_layout.wants_nhwc)
    verify_graph(after)
    assert_same(before, after)
    assert count(after, "ConvNHWC") == 4 and count(after, "Conv") == 1
    assert count(after, "AveragePoolNHWC") == 1 and count(after, "MaxPoolNHWC") == 1
    (cat,) = [n for n in after.nodes if n.op == "Concat"]
    assert cat.attr("axis") == 3
    assert count(after, "Transpose") == 2      # x -> NHWC, cat -> NCHW
