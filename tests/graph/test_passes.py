"""Before/after tests of the graph passes on small hand-built graphs.

Every rewrite is also checked for numerical equivalence (numpy reference interpreter on
random inputs) and with the verifier.
"""
from __future__ import annotations

import numpy as np
import pytest

from hidetc.graph.evaluate import infer_node
from hidetc.graph.ir import Graph, Node, TensorType
from hidetc.graph.passes import (
    canonicalize_gemm,
    canonicalize_shapes,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    fold_batchnorm,
    fold_constants,
    remove_identity,
)
from hidetc.graph.reference import run_graph
from hidetc.graph.verify import GraphVerifyError, propagate_values, verify_graph

N = Node.make


def i64(*values: int) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def f32(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def build(inputs: dict, nodes: list[Node], outputs: list[str],
          constants: dict | None = None) -> Graph:
    """A verified graph; node output types come from the ops' inference rules."""
    constants = {k: np.asarray(v) for k, v in (constants or {}).items()}
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


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name in graph.inputs:
        t = graph.types[name]
        if t.dtype == "bool":
            feeds[name] = rng.random(t.shape) < 0.5
        elif t.dtype.startswith(("int", "uint")):
            feeds[name] = rng.integers(0, 5, t.shape).astype(t.dtype)
        else:
            feeds[name] = rng.standard_normal(t.shape).astype(t.dtype)
    return feeds


def check_rewrite(before: Graph, after: Graph) -> None:
    """`after` verifies, keeps the interface, and computes what `before` computes."""
    verify_graph(after)
    assert after.inputs == before.inputs and after.outputs == before.outputs
    for name in before.outputs:
        assert after.types[name] == before.types[name]
    feeds = random_inputs(before)
    expected, actual = run_graph(before, feeds), run_graph(after, feeds)
    for name in before.outputs:
        np.testing.assert_allclose(actual[name], expected[name], rtol=1e-5, atol=1e-5)


def shape_chain_graph() -> Graph:
    """x[2,3,4] -> Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])) -> Relu."""
    nodes = [N("Shape", ["x"], ["s"]),
             N("Gather", ["s", "zero"], ["n"], axis=0),
             N("Unsqueeze", ["n", "axes0"], ["nu"]),
             N("Concat", ["nu", "minus1"], ["shape"], axis=0),
             N("Reshape", ["x", "shape"], ["r"]),
             N("Relu", ["r"], ["y"])]
    consts = {"zero": np.array(0, np.int64), "axes0": i64(0), "minus1": i64(-1)}
    return build({"x": ("float32", (2, 3, 4))}, nodes, ["y"], consts)


# ---------------------------------------------------------------- fold_constants

def test_fold_constants_collapses_shape_chain():
    graph = shape_chain_graph()
    folded = fold_constants.run(graph)
    assert folded.op_counts() == {"Reshape": 1, "Relu": 1}
    reshape = folded.nodes[0]
    assert reshape.inputs[0] == "x"
    assert folded.constants[reshape.inputs[1]].tolist() == [2, -1]
    check_rewrite(graph, folded)


def test_fold_constants_all_constant_nodes_and_size():
    nodes = [N("Add", ["a", "b"], ["ab"]), N("Size", ["x"], ["n"]),
             N("Cast", ["n"], ["nf"], to="float32"), N("Mul", ["x", "ab"], ["xm"]),
             N("Add", ["xm", "nf"], ["y"])]
    graph = build({"x": ("float32", (2, 3))}, nodes, ["y"], {"a": f32(3), "b": f32(3, seed=1)})
    folded = fold_constants.run(graph)
    assert folded.op_counts() == {"Mul": 1, "Add": 1}
    assert folded.constants["nf"].dtype == np.float32 and folded.constants["nf"] == 6
    check_rewrite(graph, folded)


def test_fold_constants_respects_size_limit():
    nodes = [N("ConstantOfShape", ["big_shape"], ["big"], value=1.0),
             N("Expand", ["one", "small_shape"], ["small"]),
             N("Add", ["x", "big"], ["y"]), N("Relu", ["small"], ["z"])]
    consts = {"big_shape": i64(512, 512), "small_shape": i64(4, 512),
              "one": np.ones((1, 512), np.float32)}
    graph = build({"x": ("float32", (512, 512))}, nodes, ["y", "z"], consts)
    folded = fold_constants.run(graph)
    assert folded.op_counts() == {"ConstantOfShape": 1, "Add": 1}
    assert folded.constants["small"].shape == (4, 512)


def test_fold_constants_returns_same_graph_when_nothing_to_fold():
    graph = build({"x": ("float32", (3,))}, [N("Relu", ["x"], ["y"])], ["y"])
    assert fold_constants.run(graph) is graph


def test_fold_constants_output_may_become_constant():
    graph = build({"x": ("float32", (2, 5))}, [N("Shape", ["x"], ["s"])], ["s"])
    folded = fold_constants.run(graph)
    assert folded.nodes == () and folded.constants["s"].tolist() == [2, 5]
    check_rewrite(graph, folded)


# ---------------------------------------------------------------- eliminate_dead_code

def test_eliminate_dead_code():
    nodes = [N("Relu", ["x"], ["dead"]), N("Neg", ["dead"], ["dead2"]),
             N("Add", ["x", "used"], ["y"])]
    graph = build({"x": ("float32", (3,)), "unused_input": ("float32", (2,))}, nodes, ["y"],
                  {"used": f32(3), "unused": f32(3)})
    pruned = eliminate_dead_code.run(graph)
    assert [n.op for n in pruned.nodes] == ["Add"]
    assert set(pruned.constants) == {"used"}
    assert pruned.inputs == graph.inputs and "dead" not in pruned.types
    check_rewrite(graph, pruned)
    assert eliminate_dead_code.run(pruned) is pruned


def test_eliminate_dead_code_keeps_multi_output_node_whole():
    nodes = [N("Split", ["x", "sizes"], ["a", "b"], axis=0), N("Relu", ["a"], ["y"])]
    graph = build({"x": ("float32", (4,))}, nodes, ["y"], {"sizes": i64(1, 3)})
    assert eliminate_dead_code.run(graph) is graph


# ---------------------------------------------------------------- CSE

def test_cse_merges_nodes_and_constants():
    nodes = [N("Add", ["x", "c1"], ["a1"]), N("Add", ["c2", "x"], ["a2"]),
             N("Relu", ["a1"], ["r1"]), N("Relu", ["a2"], ["r2"]),
             N("Mul", ["r1", "r2"], ["y"])]
    graph = build({"x": ("float32", (2, 3))}, nodes, ["y"],
                  {"c1": f32(3), "c2": f32(3), "c3": f32(3, seed=5)})
    merged = eliminate_common_subexpressions.run(graph)
    assert merged.op_counts() == {"Add": 1, "Relu": 1, "Mul": 1}
    assert set(merged.constants) == {"c1", "c3"}
    assert merged.nodes[-1].inputs == ("r1", "r1")
    check_rewrite(graph, merged)
    assert eliminate_common_subexpressions.run(merged) is merged


def test_cse_keeps_duplicates_defining_graph_outputs():
    nodes = [N("Relu", ["x"], ["y1"]), N("Relu", ["x"], ["y2"]), N("Relu", ["x"], ["t"]),
             N("Neg", ["t"], ["y3"])]
    graph = build({"x": ("float32", (3,))}, nodes, ["y1", "y2", "y3"])
    merged = eliminate_common_subexpressions.run(graph)
    assert merged.op_counts() == {"Relu": 2, "Neg": 1}
    assert merged.nodes[-1].inputs == ("y1",)
    check_rewrite(graph, merged)


def test_cse_distinguishes_attributes():
    nodes = [N("Softmax", ["x"], ["a"], axis=0), N("Softmax", ["x"], ["b"], axis=1),
             N("Add", ["a", "b"], ["y"])]
    graph = build({"x": ("float32", (2, 3))}, nodes, ["y"])
    assert eliminate_common_subexpressions.run(graph) is graph


# ---------------------------------------------------------------- remove_identity

def test_remove_identity_inside_graph():
    nodes = [N("Relu", ["x"], ["r"]), N("Identity", ["r"], ["i1"]),
             N("Identity", ["i1"], ["i2"]), N("Neg", ["i2"], ["y"])]
    graph = build({"x": ("float32", (3,))}, nodes, ["y"])
    out = remove_identity.run(graph)
    assert [(n.op, n.inputs) for n in out.nodes] == [("Relu", ("x",)), ("Neg", ("r",))]
    check_rewrite(graph, out)


def test_remove_identity_renames_producer_of_graph_output():
    nodes = [N("Relu", ["x"], ["r"]), N("Neg", ["r"], ["n"]), N("Identity", ["r"], ["i"]),
             N("Identity", ["i"], ["y"])]
    graph = build({"x": ("float32", (3,))}, nodes, ["n", "y"])
    out = remove_identity.run(graph)
    assert [(n.op, n.inputs, n.outputs) for n in out.nodes] == [
        ("Relu", ("x",), ("y",)), ("Neg", ("y",), ("n",))]
    check_rewrite(graph, out)


def test_remove_identity_keeps_copy_of_graph_input_and_renames_constant():
    nodes = [N("Identity", ["x"], ["y"]), N("Identity", ["c"], ["z"]),
             N("Identity", ["y"], ["w"])]
    graph = build({"x": ("float32", (3,))}, nodes, ["y", "z", "w"], {"c": f32(2)})
    out = remove_identity.run(graph)
    assert [(n.op, n.inputs, n.outputs) for n in out.nodes] == [
        ("Identity", ("x",), ("y",)), ("Identity", ("y",), ("w",))]
    assert set(out.constants) == {"z"}
    check_rewrite(graph, out)
    assert remove_identity.run(out) is out


def test_remove_same_type_casts_keeps_real_ones():
    """Cast to the type it already has (an exporter's autocast `.float()`) is an
    identity and goes; a Cast that converts stays."""
    nodes = [N("Cast", ["x"], ["c"], to="float32"), N("Relu", ["c"], ["r"]),
             N("Cast", ["r"], ["h"], to="float16"), N("Cast", ["h"], ["y"], to="float32")]
    graph = build({"x": ("float32", (3,))}, nodes, ["y"])
    out = remove_identity.run(graph)
    assert [(n.op, n.inputs) for n in out.nodes] == [
        ("Relu", ("x",)), ("Cast", ("r",)), ("Cast", ("h",))]
    check_rewrite(graph, out)


def test_remove_dropout_with_used_mask():
    nodes = [N("Dropout", ["x"], ["d", "mask"]), N("Cast", ["mask"], ["m"], to="float32"),
             N("Mul", ["d", "m"], ["y"]), N("Dropout", ["y"], ["y2"])]
    graph = build({"x": ("float32", (2, 3))}, nodes, ["y2"])
    out = remove_identity.run(graph)
    assert out.op_counts() == {"Cast": 1, "Mul": 1}
    assert out.constants["mask"].dtype == np.bool_ and out.constants["mask"].all()
    assert out.nodes[-1].outputs == ("y2",)
    check_rewrite(graph, out)


# ---------------------------------------------------------------- canonicalize_gemm

def test_gemm_with_constant_weight_becomes_matmul_add():
    node = N("Gemm", ["a", "w", "c"], ["y"], transB=1, alpha=0.5)
    graph = build({"a": ("float32", (4, 6))}, [node], ["y"], {"w": f32(5, 6), "c": f32(5)})
    out = canonicalize_gemm.run(graph)
    assert [n.op for n in out.nodes] == ["MatMul", "Add"]
    weight = out.constants[out.nodes[0].inputs[1]]
    np.testing.assert_allclose(weight, 0.5 * graph.constants["w"].T)
    check_rewrite(graph, out)


def test_gemm_with_dynamic_operands_uses_transpose_and_mul():
    node = N("Gemm", ["a", "b", "c"], ["y"], transA=1, alpha=2.0, beta=0.5)
    inputs = {"a": ("float32", (6, 4)), "b": ("float32", (6, 5)), "c": ("float32", (4, 5))}
    graph = build(inputs, [node], ["y"])
    out = canonicalize_gemm.run(graph)
    assert out.op_counts() == {"Transpose": 1, "MatMul": 1, "Mul": 2, "Add": 1}
    assert out.nodes[-1].outputs == ("y",)
    check_rewrite(graph, out)


def test_gemm_without_bias_and_matmul_untouched():
    graph = build({"a": ("float32", (4, 6))}, [N("Gemm", ["a", "w"], ["y"])], ["y"],
                  {"w": f32(6, 3)})
    out = canonicalize_gemm.run(graph)
    assert [(n.op, n.outputs) for n in out.nodes] == [("MatMul", ("y",))]
    check_rewrite(graph, out)
    assert canonicalize_gemm.run(out) is out


def test_new_names_are_fresh_and_deterministic():
    nodes = [N("Relu", ["a"], ["g_matmul"]),
             N("Gemm", ["g_matmul", "w", "c"], ["y"], name="g", transB=1)]
    graph = build({"a": ("float32", (4, 6))}, nodes, ["y"], {"w": f32(5, 6), "c": f32(5)})
    out = canonicalize_gemm.run(graph)
    matmul = next(n for n in out.nodes if n.op == "MatMul")
    assert matmul.outputs == ("g_matmul_1",) and matmul.inputs[1] == "g_b_t"
    assert str(canonicalize_gemm.run(graph)) == str(out)
    check_rewrite(graph, out)


# ---------------------------------------------------------------- fold_batchnorm

def bn_params(channels: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"scale": rng.uniform(0.5, 2, channels).astype(np.float32),
            "bias": rng.standard_normal(channels).astype(np.float32),
            "mean": rng.standard_normal(channels).astype(np.float32),
            "var": rng.uniform(0.5, 2, channels).astype(np.float32)}


@pytest.mark.parametrize("with_bias", [True, False])
def test_conv_batchnorm_folds_into_conv(with_bias):
    conv_inputs = ["x", "w", "b"] if with_bias else ["x", "w"]
    nodes = [N("Conv", conv_inputs, ["c"], pads=(1, 1, 1, 1)),
             N("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["y"],
               epsilon=1e-3)]
    consts = {"w": f32(4, 3, 3, 3), "b": f32(4, seed=2), **bn_params(4)}
    graph = build({"x": ("float32", (2, 3, 5, 5))}, nodes, ["y"], consts)
    out = fold_batchnorm.run(graph)
    assert [(n.op, n.outputs, len(n.inputs)) for n in out.nodes] == [("Conv", ("y",), 3)]
    assert out.nodes[0].attr("pads") == (1, 1, 1, 1)
    check_rewrite(graph, out)


def test_batchnorm_alone_becomes_mul_add():
    nodes = [N("Conv", ["x", "w"], ["c"]), N("Relu", ["c"], ["r"]),
             N("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["bn"]),
             N("Add", ["bn", "r"], ["y"])]
    consts = {"w": f32(4, 3, 1, 1), **bn_params(4)}
    graph = build({"x": ("float32", (2, 3, 5, 5))}, nodes, ["y"], consts)
    out = fold_batchnorm.run(graph)
    assert out.op_counts() == {"Conv": 1, "Relu": 1, "Mul": 1, "Add": 2}
    mul = next(n for n in out.nodes if n.op == "Mul")
    assert out.constants[mul.inputs[1]].shape == (4, 1, 1)
    check_rewrite(graph, out)


def test_batchnorm_with_dynamic_params_is_kept():
    node = N("BatchNormalization", ["x", "s", "bias", "mean", "var"], ["y"])
    p = bn_params(3)
    graph = build({"x": ("float32", (2, 3)), "s": ("float32", (3,))}, [node], ["y"],
                  {k: v for k, v in p.items() if k != "scale"})
    assert fold_batchnorm.run(graph) is graph


# ---------------------------------------------------------------- canonicalize_shapes

def test_shape_ops_become_static_reshapes_and_merge():
    nodes = [N("Flatten", ["x"], ["f"], axis=2),            # [2,3,20]
             N("Unsqueeze", ["f", "ax"], ["u"]),             # [1,2,3,20]
             N("Squeeze", ["u", "ax"], ["s"]),               # [2,3,20]: back to f
             N("Reshape", ["s", "shape"], ["r"]),            # [6,20]
             N("Relu", ["r"], ["y"])]
    graph = build({"x": ("float32", (2, 3, 4, 5))}, nodes, ["y"],
                  {"ax": i64(0), "shape": i64(-1, 20)})
    out = eliminate_dead_code.run(canonicalize_shapes.run(graph))
    assert [n.op for n in out.nodes] == ["Reshape", "Relu"]
    reshape = out.nodes[0]
    assert reshape.inputs[0] == "x" and out.constants[reshape.inputs[1]].tolist() == [6, 20]
    check_rewrite(graph, out)
    assert canonicalize_shapes.run(out) is out


def test_noop_reshape_and_identity_transpose_removed_keeping_output_names():
    nodes = [N("Relu", ["x"], ["r"]), N("Reshape", ["r", "same"], ["t"]),
             N("Transpose", ["t"], ["u"], perm=(0, 1)), N("Transpose", ["u"], ["y"])]
    graph = build({"x": ("float32", (2, 3))}, nodes, ["u", "y"], {"same": i64(2, 3)})
    out = canonicalize_shapes.run(graph)
    assert [(n.op, n.inputs, n.outputs) for n in out.nodes] == [
        ("Relu", ("x",), ("u",)), ("Transpose", ("u",), ("y",))]
    check_rewrite(graph, out)


def test_split_becomes_slices():
    nodes = [N("Split", ["x", "sizes"], ["a", "b", "c"], axis=-1),
             N("Concat", ["c", "a", "b"], ["y"], axis=1)]
    graph = build({"x": ("float32", (2, 9))}, nodes, ["y"], {"sizes": i64(2, 3, 4)})
    out = canonicalize_shapes.run(graph)
    assert out.op_counts() == {"Slice": 3, "Concat": 1}
    ends = [out.constants[n.inputs[2]].tolist() for n in out.nodes if n.op == "Slice"]
    assert ends == [[2], [5], [9]]
    check_rewrite(graph, out)


# ---------------------------------------------------------------- verify_graph

def small_graph(**changes) -> Graph:
    graph = build({"x": ("float32", (2, 3))},
                  [N("Add", ["x", "c"], ["a"]), N("Relu", ["a"], ["y"])], ["y"],
                  {"c": f32(3)})
    return graph.replace(**changes) if changes else graph


def test_verify_accepts_valid_graph_and_unfolded_shape_chain():
    verify_graph(small_graph())
    verify_graph(shape_chain_graph())


@pytest.mark.parametrize("case, message", [
    ("defined_twice", "defined twice"),
    ("input_is_constant", "defined twice"),
    ("use_before_def", "before it is defined"),
    ("missing_type", "has no type"),
    ("constant_type", "constant 'c'"),
    ("undefined_output", "graph output 'z'"),
    ("wrong_type", "inference gives"),
    ("inference_fails", "inference failed"),
])
def test_verify_rejects(case, message):
    graph = small_graph()
    add, relu = graph.nodes
    types = dict(graph.types)
    broken = {
        "defined_twice": lambda: graph.replace(nodes=(add, relu.with_(outputs=("a",)))),
        "input_is_constant": lambda: graph.replace(inputs=("x", "c")),
        "use_before_def": lambda: graph.replace(nodes=(relu, add)),
        "missing_type": lambda: graph.replace(types={k: v for k, v in types.items()
                                                     if k != "a"}),
        "constant_type": lambda: graph.replace(constants={"c": f32(4)}),
        "undefined_output": lambda: graph.replace(outputs=("y", "z")),
        "wrong_type": lambda: graph.replace(types={**types, "y": TensorType("float32", (3,))}),
        "inference_fails": lambda: graph.replace(
            constants={"c": f32(4)}, types={**types, "c": TensorType("float32", (4,))}),
    }[case]()
    with pytest.raises(GraphVerifyError, match=message):
        verify_graph(broken)
    assert issubclass(GraphVerifyError, AssertionError)
