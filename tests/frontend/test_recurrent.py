"""RNN/GRU/LSTM read as unrolled recurrences (hidetc/frontend/onnx/recurrent.py), run by
the graph's numpy reference and compared with ONNX Runtime (which, unlike onnx's
reference evaluator, honours sequence_lens, clip, activations and peepholes; batch-major
layout=1, which ONNX Runtime refuses, is compared with onnx's reference evaluator).
Tolerance: float32, rtol 1e-4 / atol 1e-5 (a few dozen float ops per step).
The compiled CPU path of the same decompositions runs in the node-test suite
(test_rnn_*, test_gru_*, test_lstm_*)."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from hidetc.errors import HidetcError
from hidetc.frontend.onnx.importer import import_model
from hidetc.graph.reference import run_graph

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
RNG = np.random.default_rng(7)


def _model(op, seq=4, batch=3, inputs=5, hidden=6, direction="forward", layout=0,
           lens=None, peepholes=False, initial=True, runtime_lens=False, **attrs):
    dirs = 2 if direction == "bidirectional" else 1
    g = GATES[op]
    x_shape = (seq, batch, inputs) if layout == 0 else (batch, seq, inputs)
    state = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    consts = {"W": RNG.standard_normal((dirs, g * hidden, inputs)) * 0.5,
              "R": RNG.standard_normal((dirs, g * hidden, hidden)) * 0.5,
              "B": RNG.standard_normal((dirs, 2 * g * hidden)) * 0.3}
    names = ["X", "W", "R", "B", "", "", ""]
    if lens is not None and not runtime_lens:
        consts["L"] = np.array(lens, np.int32)
    if lens is not None:
        names[4] = "L"
    if initial:
        consts["H0"] = RNG.standard_normal(state) * 0.3
        names[5] = "H0"
    if op == "LSTM":
        if initial:
            consts["C0"] = RNG.standard_normal(state) * 0.3
            names[6] = "C0"
        if peepholes:
            consts["P"] = RNG.standard_normal((dirs, 3 * hidden)) * 0.3
            names.append("P")
    while names and not names[-1]:
        names.pop()
    outputs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outputs, hidden_size=hidden, direction=direction,
                            layout=layout, **attrs)
    graph_inputs = [helper.make_tensor_value_info("X", TensorProto.FLOAT, x_shape)]
    if runtime_lens:
        graph_inputs.append(helper.make_tensor_value_info("L", TensorProto.INT32, (batch,)))
    graph = helper.make_graph(
        [node], "rnn", graph_inputs,
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
        [numpy_helper.from_array(v if v.dtype == np.int32 else v.astype(np.float32), k)
         for k, v in consts.items()])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
    proto.ir_version = 8
    feeds = {"X": RNG.standard_normal(x_shape).astype(np.float32)}
    if runtime_lens:
        feeds["L"] = np.array(lens, np.int32)
    return proto, feeds


def _check(proto: onnx.ModelProto, feeds: dict, peer: str = "ort") -> None:
    if peer == "ort":
        expected = ort.InferenceSession(proto.SerializeToString(),
                                        providers=["CPUExecutionProvider"]).run(None, feeds)
    else:   # ONNX Runtime refuses layout=1; onnx's reference reads it (default forms only)
        expected = ReferenceEvaluator(proto).run(None, feeds)
    graph = import_model(proto)
    got = run_graph(graph, feeds)
    for name, want in zip(graph.outputs, expected):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
def test_directions_and_layouts(op, direction, layout):
    _check(*_model(op, direction=direction, layout=layout), "ort" if layout == 0 else "ref")


@pytest.mark.parametrize("op", ["RNN", "GRU", "LSTM"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_sequence_lens_constant(op, direction):
    _check(*_model(op, direction=direction, lens=[4, 2, 1]))


@pytest.mark.parametrize("op", ["GRU", "LSTM"])
def test_sequence_lens_runtime_input(op):
    _check(*_model(op, direction="bidirectional", lens=[3, 4, 1], runtime_lens=True))


def test_gru_linear_before_reset():
    _check(*_model("GRU", linear_before_reset=1, direction="bidirectional"))


def test_lstm_peepholes_clip_no_initial_state():
    _check(*_model("LSTM", peepholes=True, clip=0.7, initial=False))


@pytest.mark.parametrize("op,acts", [
    ("RNN", ["Relu"]),
    ("GRU", ["HardSigmoid", "Softsign"]),
    ("LSTM", ["Sigmoid", "LeakyRelu", "Tanh"]),
])
def test_activations_with_parameters(op, acts):
    alphas = [0.3] if "LeakyRelu" in acts or "HardSigmoid" in acts else []
    betas = [0.45] if "HardSigmoid" in acts else []
    extra = {"activation_alpha": alphas} if alphas else {}
    if betas:
        extra["activation_beta"] = betas
    _check(*_model(op, activations=acts, **extra))


def test_bad_forms_are_one_line_errors():
    proto, _ = _model("LSTM", input_forget=1)
    with pytest.raises(HidetcError, match="input_forget=1 is not supported"):
        import_model(proto)
    proto, _ = _model("RNN", activations=["Gaussian"])
    with pytest.raises(HidetcError, match="activation 'Gaussian' is not supported"):
        import_model(proto)
    proto, _ = _model("GRU", direction="bidirectional")
    direction = next(a for a in proto.graph.node[0].attribute if a.name == "direction")
    direction.s = b"forward"   # W still holds two directions
    with pytest.raises(HidetcError, match="direction 'forward' expects 1"):
        import_model(proto)
