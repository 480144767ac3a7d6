"""fuse_qdq (frontend/onnx/fuse_qdq.py): ONNX Runtime's QDQ patterns rewritten into integer
ONNX ops, judged by ONNX Runtime itself: the original model and the rewritten one, run by
ORT (CPU, all graph optimizations) on the same inputs, give equal outputs.

Cases with int8 activations run ORT with `session.qdqisint8allowed=1`: without it, ORT on
x86 fuses an int8 pattern only where it can first turn the activations' Q -> DQ pairs
into uint8 ones (a Q whose one use is one DQ with one use), and computes the others in
float; the rewrite follows the integer semantics (ORT's on Arm)."""
import os
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

from hidetc.frontend.onnx.fuse_qdq import fuse_qdq

F, U8, I8 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8
NP = {U8: np.uint8, I8: np.int8}
ANCHORS = ("Conv", "MatMul", "Gemm")
ORT_FUSED = ("QLinearConv", "QLinearMatMul", "MatMulIntegerToFloat", "QGemm")


def session(model: onnx.ModelProto | str, int8: bool = False,
            save: str = "") -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.log_severity_level = 3
    if int8:
        so.add_session_config_entry("session.qdqisint8allowed", "1")
    if save:
        so.optimized_model_filepath = save
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


def ort_fusions(model: onnx.ModelProto, int8: bool = False) -> int:
    """How many QDQ groups ORT fuses into its integer kernels in `model`."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "optimized.onnx")
        session(model, int8, save=path)
        return sum(op in ORT_FUSED for op in ops(onnx.load(path)))


def check(model: onnx.ModelProto, feeds: dict, fused: int, int8: bool = False):
    """Rewrite `model`: `fused` patterns, input untouched, a valid model with unique node
    names, and ORT's outputs of both models equal. Returns the rewritten model."""
    before = model.SerializeToString()
    new, n = fuse_qdq(model)
    assert model.SerializeToString() == before
    assert n == fused == ort_fusions(model, int8)
    onnx.checker.check_model(new, full_check=True)
    names = [node.name for node in new.graph.node if node.name]
    assert len(names) == len(set(names))
    wants = session(model, int8).run(None, feeds)
    for want, got in zip(wants, session(new, int8).run(None, feeds)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    return new


def ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


class Graph:
    """A small QDQ graph under construction."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.inputs, self.feeds = [], [], [], {}

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def dq(self, q: str, scale, zp=None, axis=None) -> str:
        ins = [q, self.const(f"{q}_scale", np.asarray(scale, np.float32))]
        if zp is not None:
            ins.append(self.const(f"{q}_zp", zp))
        attrs = {} if axis is None else {"axis": axis}
        self.nodes.append(helper.make_node("DequantizeLinear", ins, [f"{q}_f"], **attrs))
        return f"{q}_f"

    def act(self, name: str, qtype: int, shape, scale: float = 0.02, zp: int = 5) -> str:
        """A quantized graph input (full range values), dequantized."""
        info = np.iinfo(NP[qtype])
        self.feeds[name] = self.rng.integers(info.min, info.max + 1, shape).astype(NP[qtype])
        self.inputs.append(helper.make_tensor_value_info(name, qtype, shape))
        return self.dq(name, scale, NP[qtype](zp))

    def weight(self, name: str, wtype: int, shape, axis: int | None, zp: int = 0) -> tuple:
        """A constant weight, per-tensor (axis None) or per-channel along axis; returns the
        dequantized name and the typical scale."""
        lo = 0 if wtype == U8 else -127
        w = self.rng.integers(lo, lo + 255, shape).astype(NP[wtype])
        self.const(name, w)
        if axis is None:
            scale, zps = np.float32(0.01), NP[wtype](zp)
        else:
            scale = (self.rng.uniform(0.5, 2.0, shape[axis]) * 0.01).astype(np.float32)
            zps = np.full(shape[axis], zp, NP[wtype])
        return self.dq(name, scale, zps, axis), scale

    def bias(self, name: str, xs: float, ws, n: int) -> str:
        """An int32 bias of scale xs * ws (per channel when ws is) and zero point 0."""
        self.const(name, self.rng.integers(-20000, 20000, n).astype(np.int32))
        scale = np.float32(xs) * np.asarray(ws, np.float32)
        if scale.size > 1:
            return self.dq(name, scale, np.zeros(n, np.int32), axis=0)
        return self.dq(name, scale, np.int32(0))

    def node(self, op: str, ins: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, ins, [out], name=f"{op.lower()}_{out}", **attrs))
        return out

    def quant(self, x: str, ys: float, qtype: int, zp: int = 3) -> str:
        zp_name = self.const(f"{x}_yzp", NP[qtype](zp))
        ins = [x, self.const(f"{x}_ys", np.float32(ys)), zp_name]
        return self.node("QuantizeLinear", ins, f"{x}_q")

    def model(self, outputs: list[str], opset: int = 21) -> onnx.ModelProto:
        outs = [onnx.ValueInfoProto(name=o) for o in outputs]  # typed by shape inference
        graph = helper.make_graph(self.nodes, "g", self.inputs, outs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                                  ir_version=10)
        return onnx.shape_inference.infer_shapes(model) if opset >= 10 else model


def out_scale(xs: float, ws, k: int) -> float:
    """ys putting y's standard deviation near 30 steps (full-range x and w)."""
    return float(xs * np.mean(ws) * np.sqrt(k) * 74 * 73 / 30)


# --- one-pattern models ------------------------------------------------------------------
CONV_CASES = {
    "u8 per-tensor": (U8, I8, False, False, {}),
    "u8 per-channel bias pads strides": (U8, I8, True, True, {"pads": [1, 1, 1, 1],
                                                             "strides": [2, 2]}),
    "u8 x u8 w zero point, bias": (U8, U8, False, True, {"pads": [0, 1, 0, 1]}),
    "u8 x u8 w per-channel, group 2": (U8, U8, True, True, {"group": 2, "pads": [1, 1, 1, 1]}),
    "s8 per-channel bias group 2": (I8, I8, True, True, {"group": 2, "pads": [1, 1, 1, 1]}),
    "s8 per-tensor dilations": (I8, I8, False, False, {"dilations": [2, 2]}),
}


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv(case):
    xtype, wtype, per_channel, with_bias, attrs = CONV_CASES[case]
    g, cin, oc = Graph(len(case)), 4, 6
    group = attrs.get("group", 1)
    x = g.act("x", xtype, [2, cin, 9, 9])
    w, ws = g.weight("w", wtype, [oc, cin // group, 3, 3], 0 if per_channel else None,
                     zp=128 if wtype == U8 else 0)
    ins = [x, w] + ([g.bias("b", 0.02, ws, oc)] if with_bias else [])
    g.node("Conv", ins, "c", kernel_shape=[3, 3], **attrs)
    y = g.quant("c", out_scale(0.02, ws, 9 * cin // group), xtype)
    new = check(g.model([y]), g.feeds, 1, int8=xtype == I8)
    assert ops(new).count("ConvInteger") == 1 and "DequantizeLinear" not in ops(new)
    assert {t.name for t in new.graph.initializer} >= {"w", "c_yzp"}
    assert "b" not in {t.name for t in new.graph.initializer}


MATMUL_CASES = {  # a type, b (per-tensor / per-column / runtime), to Q, a's shape
    "const per-tensor -> Q": (U8, "tensor", True, [3, 16]),
    "const per-column -> Q, s8, 3-D a": (I8, "column", True, [2, 3, 16]),
    "const per-column -> float": (U8, "column", False, [3, 16]),
    "const per-tensor -> float, s8, 3-D a": (I8, "tensor", False, [2, 3, 16]),
    "runtime -> Q": (U8, "runtime", True, [2, 4, 16]),
    "runtime -> Q, s8": (I8, "runtime", True, [2, 4, 16]),
    "runtime -> float": (U8, "runtime", False, [2, 4, 16]),
}


@pytest.mark.parametrize("case", MATMUL_CASES)
def test_matmul(case):
    atype, kind, to_q, shape = MATMUL_CASES[case]
    g, n = Graph(len(case)), 5
    a = g.act("a", atype, shape)
    if kind == "runtime":
        zp = -2 if atype == I8 else 130
        b, ws = g.act("b", atype, [shape[0], 16, n], scale=0.01, zp=zp), 0.01
    else:
        b, ws = g.weight("w", I8, [16, n], 1 if kind == "column" else None)
    g.node("MatMul", [a, b], "m")
    out = g.quant("m", out_scale(0.02, ws, 16), atype) if to_q else "m"
    new = check(g.model([out]), g.feeds, 1, int8=atype == I8)
    assert ops(new).count("MatMulInteger") == 1 and "DequantizeLinear" not in ops(new)


GEMM_CASES = {  # a type, transB, per-channel, bias, to Q
    "transB bias per-channel -> Q": (U8, 1, True, True, True),
    "transB bias per-tensor -> float": (U8, 1, False, True, False),
    "transB bias per-channel -> float": (U8, 1, True, True, False),
    "no bias -> float, s8": (I8, 0, True, False, False),
    "transB bias -> Q, s8": (I8, 1, False, True, True),
}


@pytest.mark.parametrize("case", GEMM_CASES)
def test_gemm(case):
    atype, trans_b, per_channel, with_bias, to_q = GEMM_CASES[case]
    g, n = Graph(len(case)), 7
    a = g.act("a", atype, [4, 16])
    w, ws = g.weight("w", I8, [n, 16] if trans_b else [16, n],
                     (0 if trans_b else 1) if per_channel else None)
    ins = [a, w] + ([g.bias("b", 0.02, ws, n)] if with_bias else [])
    g.node("Gemm", ins, "m", transB=trans_b)
    out = g.quant("m", out_scale(0.02, ws, 16), atype) if to_q else "m"
    new = check(g.model([out]), g.feeds, 1, int8=atype == I8)
    assert ops(new).count("MatMulInteger") == 1 and "Gemm" not in ops(new)


def test_conv_per_channel_weight_zero_points():
    """Weight zero points that differ per channel stay a 1-D ConvInteger input, which ORT's
    ConvInteger does not take: the onnx reference runs the rewritten model instead."""
    g = Graph(3)
    w = g.const("w", g.rng.integers(0, 256, [3, 4, 3, 3]).astype(np.uint8))
    wf = g.dq(w, [0.01, 0.02, 0.015], np.array([120, 128, 131], np.uint8), axis=0)
    g.node("Conv", [g.act("x", U8, [1, 4, 6, 6]), wf], "c", pads=[1, 1, 1, 1])
    model = g.model([g.quant("c", 2.0, U8)])
    new, n = fuse_qdq(model)
    assert n == 1 == ort_fusions(model)
    got = ReferenceEvaluator(new).run(None, g.feeds)[0]
    np.testing.assert_array_equal(got, session(model).run(None, g.feeds)[0])


def test_gemm_float_bias_is_added_to_the_accumulator():
    """ORT's QGemm adds the int32 bias before the scaling also without a Q after it
    (float32(acc + bias) * S, not float32(acc) * S + bias * bias_scale): both are checked
    against ORT, and the second is seen to differ."""
    g = Graph(7)
    a = g.act("a", U8, [8, 64])
    w, ws = g.weight("w", I8, [16, 64], 0)
    g.node("Gemm", [a, w, g.bias("b", 0.02, ws, 16)], "m", transB=1)
    model = g.model(["m"])
    check(model, g.feeds, 1)
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    acc = (g.feeds["a"].astype(np.int64) - 5) @ inits["w"].astype(np.int64).T
    scale = np.float32(0.02) * ws
    got = session(model).run(None, g.feeds)[0]
    np.testing.assert_array_equal(got, (acc + inits["b"]).astype(np.float32) * scale)
    float_bias = acc.astype(np.float32) * scale + inits["b"].astype(np.float32) * scale
    assert np.any(got != float_bias)


@pytest.mark.parametrize("op", ["Relu", "Clip"])
def test_redundant_activation_is_dropped(op):
    """Conv -> Relu/Clip -> Q where the Q clips at least as much: ORT drops the Relu/Clip."""
    g = Graph(3)
    x = g.act("x", U8, [1, 4, 6, 6])
    w, ws = g.weight("w", I8, [3, 4, 3, 3], 0)
    g.node("Conv", [x, w], "c", pads=[1, 1, 1, 1])
    ys = out_scale(0.02, ws, 36)
    clip_ins = ["c", g.const("lo", np.float32(0)), g.const("hi", np.float32(1e4))]
    g.node(op, clip_ins if op == "Clip" else ["c"], "r")
    y = g.quant("r", ys, U8, zp=0)
    new = check(g.model([y]), g.feeds, 1)
    assert op not in ops(new)


def test_unfused_cases_left_alone():
    def conv_model(relu_zp=None, bias_factor=1.0, ytype=U8, runtime_w=False):
        g = Graph(5)
        x = g.act("x", U8, [1, 4, 6, 6])
        if runtime_w:
            w, ws = g.act("w", I8, [3, 4, 3, 3], scale=0.01, zp=0), 0.01
        else:
            w, ws = g.weight("w", I8, [3, 4, 3, 3], 0)
        b = g.bias("b", 0.02 * bias_factor, ws, 3)
        g.node("Conv", [x, w, b], "c")
        if relu_zp is not None:
            g.node("Relu", ["c"], "r")
        return g.model([g.quant("r" if relu_zp is not None else "c", 0.5, ytype,
                                zp=relu_zp or 0)])

    def matmul_model(tail):
        g = Graph(6)
        a = g.act("a", U8, [3, 16])
        w, _ = g.weight("w", I8, [16, 4], 1)
        g.node("MatMul", [a, w], "m")
        if tail == "relu":
            return g.model([g.node("Sigmoid", [g.node("Relu", ["m"], "r")], "s")])
        return g.model([g.quant("m", 0.5, U8), "m"])  # also a graph output

    def gemm_model(bias_factor):
        g = Graph(7)
        w, ws = g.weight("w", I8, [4, 16], 0)
        g.node("Gemm", [g.act("a", U8, [3, 16]), w, g.bias("b", 0.02 * bias_factor, ws, 4)],
               "m", transB=1)
        return g.model(["m"])

    cases = [(conv_model(relu_zp=3), 0),  # the Relu is not redundant: ORT fuses nothing
             (conv_model(bias_factor=2.0), 0),  # bias scale != xs * ws
             (conv_model(ytype=I8), 0),  # u8 in, s8 out
             (matmul_model("relu"), 0),  # MatMul -> Relu -> not a Q: ORT fuses nothing
             (matmul_model("output"), 0),  # MatMul -> Q and a graph output
             # Left alone by contract, though ORT fuses them: a runtime Conv weight (its
             # QLinearConv takes one), a bias scale within ORT 1.32's ~1 % tolerance of
             # xs * ws for a Conv, any bias scale for a Gemm (ORT's QGemm ignores it).
             (conv_model(runtime_w=True), 1),
             (conv_model(bias_factor=1.005), 1),
             (gemm_model(2.0), 1)]
    for model, by_ort in cases:
        new, n = fuse_qdq(model)
        assert new is model and n == 0
        assert ort_fusions(model) == by_ort


def test_matmul_relu_with_two_uses_is_fused_to_float():
    """ORT looks through a Relu for a Q only when the Relu's output has one use."""
    g = Graph(6)
    g.node("MatMul", [g.act("a", U8, [3, 16]), g.weight("w", I8, [16, 4], 1)[0]], "m")
    g.node("Add", [g.node("Relu", ["m"], "r"), "r"], "s")
    check(g.model(["s"]), g.feeds, 1)


@pytest.mark.parametrize("opset", [10, 13, 19])
def test_opsets(opset):
    """Per-axis DQ from opset 13; Clip's bounds attributes before 11, inputs after."""
    g = Graph(opset)
    w, ws = g.weight("w", I8, [6, 4, 3, 3], 0 if opset >= 13 else None)
    g.node("Conv", [g.act("x", U8, [1, 4, 7, 7]), w, g.bias("b", 0.02, ws, 6)], "c")
    if opset < 11:
        g.node("Clip", ["c"], "r", min=0.0, max=1e4)
    else:
        g.node("Clip", ["c", g.const("lo", np.float32(0)), g.const("hi", np.float32(1e4))], "r")
    y = g.quant("r", out_scale(0.02, ws, 36), U8, zp=0)
    g.node("MatMul", [g.act("a", U8, [3, 16]), g.weight("v", I8, [16, 5], None)[0]], "m")
    check(g.model([y, "m"], opset=opset), g.feeds, 2)


def test_constant_nodes_names_and_kept_initializers():
    """Constants given as Constant nodes; an unused initializer and a name the rewrite would
    have taken stay as they are."""
    g = Graph(10)
    w, ws = g.weight("w", I8, [16, 5], 1)
    g.node("MatMul", [g.act("a", U8, [3, 16]), w], "m")
    y = g.quant("m", out_scale(0.02, ws, 16), U8)
    model = g.model([y])
    nodes = [helper.make_node("Constant", [], [t.name], value=t) for t in model.graph.initializer]
    nodes += model.graph.node
    del model.graph.initializer[:], model.graph.node[:]
    model.graph.node.extend(nodes)
    taken = numpy_helper.from_array(np.zeros(2, np.float32), "matmul_m_acc")
    model.graph.initializer.append(taken)
    new = check(model, g.feeds, 1)
    assert [t.name for t in new.graph.initializer][0] == "matmul_m_acc"
    assert "matmul_m_acc_1" in {o for node in new.graph.node for o in node.output}
    kept = {node.output[0] for node in new.graph.node if node.op_type == "Constant"}
    assert kept == {"a_zp", "w", "m_yzp"}  # the scales went with the DQs and the Q


def test_values_used_in_subgraphs_are_kept():
    g = Graph(12)
    a = g.act("a", U8, [3, 16])
    w, ws = g.weight("w", I8, [16, 5], None)
    g.node("MatMul", [a, w], "m")
    y = g.quant("m", out_scale(0.02, ws, 16), U8)
    g.inputs.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    g.feeds["cond"] = np.array(True)
    branch = [helper.make_graph([helper.make_node("Identity", [a], [f"o{i}"])], f"b{i}", [],
                                [helper.make_tensor_value_info(f"o{i}", F, [3, 16])])
              for i in range(2)]
    g.nodes.append(helper.make_node("If", ["cond"], ["sub"], then_branch=branch[0],
                                    else_branch=branch[1]))
    new = check(g.model([y, "sub"]), g.feeds, 1)
    assert ops(new).count("DequantizeLinear") == 1  # a's, read by the branches


def test_block_size_and_float_models_left_alone():
    g = Graph(8)
    a = g.act("a", U8, [3, 32])
    w = g.const("w", np.ones([32, 4], np.int8))
    scale = g.const("ws", np.full([2, 4], 0.01, np.float32))
    g.nodes.append(helper.make_node("DequantizeLinear", [w, scale], ["wf"], axis=0,
                                    block_size=16))
    g.node("MatMul", [a, "wf"], "m")
    blocked = g.model(["m"])
    float_model = onnx.parser.parse_model("""
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[2, 3] x, float[3, 4] w) => (float[2, 4] y) { y = MatMul(x, w) }""")
    g = Graph(8)
    g.node("MatMul", [g.act("a", U8, [3, 16]), g.weight("w", I8, [16, 4], None)[0]], "m")
    old_opset = g.model(["m"], opset=9)  # fusable but for the opset
    for model in (blocked, float_model, old_opset):
        new, n = fuse_qdq(model)
        assert new is model and n == 0


def test_external_data(tmp_path):
    g = Graph(9)
    a = g.act("a", U8, [4, 16])
    w, ws = g.weight("w", I8, [16, 7], 1)
    g.node("MatMul", [a, w], "m")
    g.quant("m", out_scale(0.02, ws, 16), U8)
    model = g.model(["m_q"])
    path = tmp_path / "model.onnx"
    onnx.save_model(model, path, save_as_external_data=True, location="weights.bin",
                    size_threshold=0)
    lazy = onnx.load(path, load_external_data=False)
    new, n = fuse_qdq(lazy, base_dir=str(tmp_path))
    assert n == 1
    external = {t.name for t in new.graph.initializer
                if t.data_location == TensorProto.EXTERNAL}
    assert {"w", "a_zp", "m_yzp"} <= external  # kept as they were
    assert "a_scale" not in {t.name for t in new.graph.initializer}  # only its DQ used it
    onnx.save_model(new, tmp_path / "new.onnx")
    want = session(str(path)).run(None, g.feeds)
    got = session(str(tmp_path / "new.onnx")).run(None, g.feeds)
    np.testing.assert_array_equal(got[0], want[0])


# --- models quantized by onnxruntime.quantization.quantize_static ----------------------------
def init(rng, name: str, shape, std: float = 0.3) -> onnx.TensorProto:
    return numpy_helper.from_array((rng.standard_normal(shape) * std).astype(np.float32), name)


def cnn(rng) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    return onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 3, 12, 12] x) => (float[1, 10] y) {
            c1 = Conv <pads = [1, 1, 1, 1]> (x, w1, b1)
            r1 = Relu(c1)
            c2 = Conv <pads = [1, 1, 1, 1]> (r1, w2, b2)
            s = Add(c2, r1)
            p = GlobalAveragePool(s)
            f = Flatten(p)
            y = Gemm <transB = 1> (f, wg, bg)
        }"""), [init(rng, "w1", [8, 3, 3, 3]), init(rng, "b1", [8]),
                init(rng, "w2", [8, 8, 3, 3], 0.1), init(rng, "b2", [8]),
                init(rng, "wg", [10, 8]), init(rng, "bg", [10])]


def attention(rng) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    return onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[1, 6, 16] x) => (float[1, 6, 16] y) {
            h0 = MatMul(x, w1)
            h1 = Add(h0, b1)
            h = Relu(h1)
            q = MatMul(h, wq)
            k = MatMul(h, wk)
            v = MatMul(h, wv)
            kt = Transpose <perm = [0, 2, 1]> (k)
            qk = MatMul(q, kt)
            d = Constant <value = float {4.0}> ()
            scores = Div(qk, d)
            p = Softmax <axis = -1> (scores)
            pv = MatMul(p, v)
            y = MatMul(pv, wo)
        }"""), [init(rng, n, [16, 16]) for n in ("w1", "wq", "wk", "wv", "wo")] + [
        init(rng, "b1", [16])]


class Reader(CalibrationDataReader):
    def __init__(self, rng, shape):
        self.samples = iter([{"x": rng.standard_normal(shape).astype(np.float32)}
                             for _ in range(2)])

    def get_next(self):
        return next(self.samples, None)


MODELS = {"cnn": (cnn, [1, 3, 12, 12], 2, 1), "attention": (attention, [1, 6, 16], 0, 7)}


@pytest.mark.parametrize("act", ["u8", "s8"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("name", MODELS)
def test_quantize_static_models(tmp_path, name, per_channel, act):
    build, shape, convs, matmuls = MODELS[name]
    rng = np.random.default_rng(11)
    model, inits = build(rng)
    model.graph.initializer.extend(inits)
    qtype = QuantType.QUInt8 if act == "u8" else QuantType.QInt8
    quantize_static(model, tmp_path / "q.onnx", Reader(rng, shape), quant_format=QuantFormat.QDQ,
                    per_channel=per_channel, activation_type=qtype, weight_type=QuantType.QInt8)
    quantized = onnx.shape_inference.infer_shapes(onnx.load(tmp_path / "q.onnx"))
    feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
    new = check(quantized, feeds, convs + matmuls, int8=act == "s8")
    assert ops(new).count("ConvInteger") == convs
    assert ops(new).count("MatMulInteger") == matmuls
    assert not set(ANCHORS) & set(ops(new))
    made = {o for node in new.graph.node for o in node.output}
    made_before = {o for node in quantized.graph.node for o in node.output}
    gone = made_before - made  # the DQ and fused nodes' outputs: their value_info went
    assert gone and not gone & {v.name for v in new.graph.value_info}
    assert len(new.graph.value_info) == len(quantized.graph.value_info) - len(
        gone & {v.name for v in quantized.graph.value_info})
