"""Attention (opsets 23..25) and RotaryEmbedding (23) read as decompositions
(hidetc/frontend/onnx/attention.py): the imported graph, run by the numpy reference
interpreter, against onnx's ReferenceEvaluator (rtol 1e-5 / atol 1e-6 in float32), and
the one-line errors for forms outside the spec."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from hidetc.errors import ModelError
from hidetc.frontend import import_model
from hidetc.graph.reference import run_graph

F, B, I64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
_NP = {F: np.float32, B: np.bool_, I64: np.int64}


def _model(op, inputs, outputs, opset, **attrs):
    """One `op` node; inputs are (name, elem, shape) or "" (omitted), outputs names or ""."""
    node = helper.make_node(op, [i[0] if i else "" for i in inputs], list(outputs), **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(*i) for i in inputs if i],
        [helper.make_empty_tensor_value_info(o) for o in outputs if o])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=10)


def _feeds(inputs, seed=0, fill=None):
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, elem, shape in (i for i in inputs if i):
        if fill and name in fill:
            feeds[name] = np.asarray(fill[name], dtype=_NP[elem])
        elif elem == B:
            feeds[name] = rng.random(shape) < 0.7
        else:
            feeds[name] = rng.standard_normal(shape).astype(_NP[elem])
    return feeds


def _check(op, inputs, outputs, opset=23, fill=None, **attrs):
    proto = _model(op, inputs, outputs, opset, **attrs)
    feeds = _feeds(inputs, fill=fill)
    ours = run_graph(import_model(proto), feeds)
    theirs = ReferenceEvaluator(proto).run(None, feeds)
    for name, expected in zip([o for o in outputs if o], theirs):
        assert ours[name].shape == expected.shape, name
        assert not np.isnan(ours[name]).any(), name
        np.testing.assert_allclose(ours[name], expected, rtol=1e-5, atol=1e-6, err_msg=name)
    return ours, feeds


ATTN_OUT = ["Y", "present_key", "present_value", "qk_matmul_output"]


@pytest.mark.parametrize("mode", [1, 2, 3])
def test_3d_gqa_past_short_float_mask_softcap_modes(mode):
    inputs = [("Q", F, [2, 3, 24]), ("K", F, [2, 5, 8]), ("V", F, [2, 5, 10]),
              ("attn_mask", F, [3, 6]),       # shorter than past 4 + 5: padded with -inf
              ("past_key", F, [2, 2, 4, 4]), ("past_value", F, [2, 2, 4, 5])]
    _check("Attention", inputs, ATTN_OUT, q_num_heads=6, kv_num_heads=2, softcap=1.5,
           qk_matmul_output_mode=mode, is_causal=1, scale=0.3)


def test_4d_bool_mask_with_fully_masked_rows_gives_zero():
    inputs = [("Q", F, [1, 2, 3, 8]), ("K", F, [1, 2, 4, 8]), ("V", F, [1, 2, 4, 8]),
              ("attn_mask", B, [3, 4])]
    mask = [[True, False, True, False], [False] * 4, [True] * 4]
    ours, _ = _check("Attention", inputs, ["Y", "", "", "qk_matmul_output"],
                     fill={"attn_mask": mask}, qk_matmul_output_mode=3)
    assert (ours["Y"][:, :, 1] == 0).all() and (ours["qk_matmul_output"][:, :, 1] == 0).all()


def test_4d_mode0_is_the_raw_scaled_product_even_with_softcap():
    inputs = [("Q", F, [1, 2, 3, 4]), ("K", F, [1, 2, 5, 4]), ("V", F, [1, 2, 5, 4])]
    proto = _model("Attention", inputs, ["Y", "", "", "qk"], 23, softcap=0.5)
    feeds = _feeds(inputs)
    ours = run_graph(import_model(proto), feeds)
    raw = feeds["Q"] @ feeds["K"].transpose(0, 1, 3, 2) / 2.0
    np.testing.assert_allclose(ours["qk"], raw, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lengths", [[6, 2, 4], [1, 0, 3]])
def test_opset24_nonpad_kv_seqlen_causal_bottom_right(lengths):
    inputs = [("Q", F, [3, 4, 3, 8]), ("K", F, [3, 2, 6, 8]), ("V", F, [3, 2, 6, 8]),
              ("attn_mask", B, [3, 1, 3, 5]), "", "", ("nonpad_kv_seqlen", I64, [3])]
    _check("Attention", inputs, ["Y"], opset=24, fill={"nonpad_kv_seqlen": lengths},
           is_causal=1)


def test_opset24_nonpad_without_causal_and_float_rank3_mask():
    inputs = [("Q", F, [2, 3, 4, 8]), ("K", F, [2, 3, 6, 8]), ("V", F, [2, 3, 6, 8]),
              ("attn_mask", F, [3, 4, 6]), "", "", ("nonpad_kv_seqlen", I64, [2])]
    _check("Attention", inputs, ["Y"], opset=24, fill={"nonpad_kv_seqlen": [4, 6]})


@pytest.mark.parametrize("attrs", [dict(left_window_size=1, right_window_size=2),
                                   dict(left_window_size=2, is_causal=1)])
def test_opset25_sliding_window(attrs):
    inputs = [("Q", F, [2, 2, 4, 8]), ("K", F, [2, 2, 3, 8]), ("V", F, [2, 2, 3, 8]),
              "", ("past_key", F, [2, 2, 3, 8]), ("past_value", F, [2, 2, 3, 8])]
    _check("Attention", inputs, ATTN_OUT[:3], opset=25, **attrs)


def test_softmax_precision_double():
    inputs = [("Q", F, [1, 2, 3, 4]), ("K", F, [1, 2, 3, 4]), ("V", F, [1, 2, 3, 4])]
    _check("Attention", inputs, ["Y"], softmax_precision=TensorProto.DOUBLE, is_causal=1)


@pytest.mark.parametrize("bad, kv_hidden, message", [
    (dict(q_num_heads=5, kv_num_heads=2), 8, "not a multiple of the number of heads"),
    (dict(q_num_heads=3, kv_num_heads=2), 8, "kv heads (2) must divide q heads (3)"),
    (dict(q_num_heads=3, kv_num_heads=2), 6, "K head size 3 differs from Q head size 4"),
    (dict(q_num_heads=3, kv_num_heads=1, qk_matmul_output_mode=4), 4, "qk_matmul_output_mode"),
    (dict(kv_num_heads=2), 8, "need the q_num_heads and kv_num_heads"),
])
def test_attention_errors_are_one_line(bad, kv_hidden, message):
    inputs = [("Q", F, [1, 3, 12]), ("K", F, [1, 3, kv_hidden]), ("V", F, [1, 3, kv_hidden])]
    with pytest.raises(ModelError, match="Attention") as info:
        import_model(_model("Attention", inputs, ["Y"], 23, **bad))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_attention_mask_too_long_and_nonpad_with_past_are_refused():
    inputs = [("Q", F, [1, 1, 2, 4]), ("K", F, [1, 1, 2, 4]), ("V", F, [1, 1, 2, 4]),
              ("attn_mask", F, [2, 3])]
    with pytest.raises(ModelError, match="attn_mask"):
        import_model(_model("Attention", inputs, ["Y"], 23))
    inputs = inputs[:3] + ["", ("past_key", F, [1, 1, 2, 4]), ("past_value", F, [1, 1, 2, 4]),
                           ("nonpad_kv_seqlen", I64, [1])]
    with pytest.raises(ModelError, match="nonpad_kv_seqlen cannot be combined"):
        import_model(_model("Attention", inputs, ["Y"], 24))


@pytest.mark.parametrize("attrs", [{}, dict(interleaved=1), dict(rotary_embedding_dim=4),
                                   dict(interleaved=1, rotary_embedding_dim=4)])
@pytest.mark.parametrize("layout", ["4d", "3d", "no_positions"])
def test_rotary_embedding(attrs, layout):
    x = ("X", F, [2, 3, 3, 8]) if layout != "3d" else ("X", F, [2, 3, 24])
    if layout == "3d":
        attrs = dict(attrs, num_heads=3)
    half = attrs.get("rotary_embedding_dim", 8) // 2
    if layout == "no_positions":
        inputs = [x, ("cos", F, [2, 3, half]), ("sin", F, [2, 3, half])]
        fill = None
    else:
        inputs = [x, ("cos", F, [7, half]), ("sin", F, [7, half]), ("pos", I64, [2, 3])]
        fill = {"pos": [[0, 3, 6], [2, 2, 1]]}
    _check("RotaryEmbedding", inputs, ["Y"], fill=fill, **attrs)


def test_rotary_embedding_errors():
    inputs = [("X", F, [1, 2, 12]), ("cos", F, [4, 3]), ("sin", F, [4, 3]), ("pos", I64, [1, 2])]
    with pytest.raises(ModelError, match="num_heads"):
        import_model(_model("RotaryEmbedding", inputs, ["Y"], 23))
    with pytest.raises(ModelError, match="rotary_embedding_dim must be even"):
        import_model(_model("RotaryEmbedding", inputs, ["Y"], 23, num_heads=2,
                            rotary_embedding_dim=5))
    import_model(_model("RotaryEmbedding", inputs, ["Y"], 23, num_heads=2))   # 3 columns: ok
    with pytest.raises(ModelError, match=r"input cos must be \[max_position, >=3\]"):
        narrow = [inputs[0], ("cos", F, [4, 2]), ("sin", F, [4, 2]), inputs[3]]
        import_model(_model("RotaryEmbedding", narrow, ["Y"], 23, num_heads=2))
