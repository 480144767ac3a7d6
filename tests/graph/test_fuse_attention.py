"""The fuse_attention pass (cuda, float16): which chains it folds into FusedAttention,
which it leaves alone, and that the fused graph computes what the original did (the
reference interpreter, op by op against the FusedAttention reference)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import models
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.passes import fuse_attention
from hidetc.graph.pipeline import lower_precision, optimize
from hidetc.graph.reference import run_graph


def _lowered(proto: onnx.ModelProto, tmp_path, precision: str = "f16"):
    path = tmp_path / "m.onnx"
    models.save(proto, path)
    return lower_precision(optimize(load_model(path)), precision)   # no target passes yet


def _attention_model(chain: str, softmax_axis: int = -1, extra_reader: bool = False,
                     q_shape=(1, 2, 16, 8)) -> onnx.ModelProto:
    """Q Kt -> chain -> Softmax -> P V; chain 'bert' (Div, Add mask), 'gpt2' (Div,
    Where causal), 'none'."""
    b, h, s, d = q_shape
    make = helper.make_node
    nodes = [make("MatMul", ["q", "kt"], ["s0"])]
    inits = [numpy_helper.from_array(np.array(np.sqrt(d), np.float32), "scale")]
    last = "s0"
    if chain in ("bert", "gpt2"):
        nodes.append(make("Div", ["s0", "scale"], ["s1"]))
        last = "s1"
    if chain == "bert":
        nodes.append(make("Add", ["s1", "mask"], ["s2"]))
        last = "s2"
    if chain == "gpt2":
        causal = np.tril(np.ones((s, s), bool)).reshape(1, 1, s, s)
        inits += [numpy_helper.from_array(causal, "causal"),
                  numpy_helper.from_array(np.array(-3.4e38, np.float32), "fill")]
        nodes.append(make("Where", ["causal", "s1", "fill"], ["s2"]))
        last = "s2"
    nodes += [make("Softmax", [last], ["p"], axis=softmax_axis), make("MatMul", ["p", "v"], ["o"])]
    outputs = [helper.make_tensor_value_info("o", TensorProto.FLOAT, [b, h, s, d])]
    if extra_reader:      # the scores are read twice: not private to the chain
        nodes.append(make("Relu", [last], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, [b, h, s, s]))
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, h, s, d]),
              helper.make_tensor_value_info("kt", TensorProto.FLOAT, [b, h, d, s]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, [b, h, s, d])]
    if chain == "bert":
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, [b, 1, 1, s]))
    graph = helper.make_graph(nodes, "attention", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("chain,steps", [("bert", ("div", "add")), ("gpt2", ("div", "where")),
                                         ("none", ())])
def test_chains_fold_and_compute_the_same(chain, steps, tmp_path):
    graph = _lowered(_attention_model(chain), tmp_path)
    fused = fuse_attention.run(graph)
    nodes = [n for n in fused.nodes if n.op == "FusedAttention"]
    assert len(nodes) == 1 and not any(n.op in ("Softmax", "MatMul") for n in fused.nodes)
    assert tuple(step[0] for step in nodes[0].attr("score")) == steps
    rng = np.random.default_rng(0)
    inputs = {name: rng.uniform(-2, 2, graph.types[name].shape).astype(np.float32)
              for name in graph.inputs}
    if chain == "bert":
        inputs["mask"] = np.where(rng.random(inputs["mask"].shape) < 0.3, -1e4,
                                  0.0).astype(np.float32)
    want, got = run_graph(graph, inputs), run_graph(fused, inputs)
    for name in graph.outputs:
        assert np.array_equal(want[name], got[name]), name       # the same ops, in order


@pytest.mark.parametrize("case", ["f32", "axis", "shared_scores", "head_too_big"])
def test_chains_left_alone(case, tmp_path):
    if case == "f32":
        graph = _lowered(_attention_model("bert"), tmp_path, "f32")
    elif case == "axis":
        graph = _lowered(_attention_model("bert", softmax_axis=2), tmp_path)
    elif case == "shared_scores":
        graph = _lowered(_attention_model("bert", extra_reader=True), tmp_path)
    else:
        graph = _lowered(_attention_model("none", q_shape=(1, 1, 16, 160)), tmp_path)
    assert fuse_attention.run(graph) is graph


def test_the_benchmark_transformers_fuse_every_layer(tmp_path):
    for name in ("bert_base", "gpt2"):
        graph = _lowered(models.build(name, tiny=True), tmp_path)
        softmaxes = sum(n.op == "Softmax" for n in graph.nodes)
        fused = fuse_attention.run(graph)
        assert softmaxes and sum(n.op == "FusedAttention" for n in fused.nodes) == softmaxes
        assert not any(n.op == "Softmax" for n in fused.nodes)
