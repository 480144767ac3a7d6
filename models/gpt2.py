"""GPT-2 small (HuggingFace GPT2LMHeadModel layout, no KV cache, logits output).

``dynamic=True``: the sequence axis is the symbolic dimension "seq", every size read
from the tensors' shapes as torch.onnx traces them with dynamic axes (valid for seq up
to the position table's n_ctx rows)."""

from __future__ import annotations

import math

import numpy as np
import onnx

from ._builder import FLOAT, FLOAT_MIN, INT64, GraphBuilder

FULL = dict(vocab=50257, seq=128, n_ctx=1024, hidden=768, heads=12, layers=12)
TINY = dict(vocab=100, seq=16, n_ctx=32, hidden=32, heads=2, layers=2)
LN_EPS = 1e-5
WTE_STD, WPE_STD = 0.02, 0.01  # HF initializer_range and the pretrained wpe scale


def _split_heads(b: GraphBuilder, t: str, nh: int, hd: int) -> str:
    return b.op("Transpose", [b.view(t, ["d0", "d1", nh, hd])], perm=[0, 2, 1, 3])


def _size(b: GraphBuilder, t: str, axis: int) -> str:
    """``t.size(axis)`` as traced: Shape -> Gather (a scalar)."""
    return b.op("Gather", [b.op("Shape", [t]), b.const(np.int64(axis))], axis=0)


def _causal_mask(b: GraphBuilder, bias: str, q: str, k: str, S: int | None) -> str:
    """self.bias[:, :, key_len - query_len : key_len, :key_len] (bool); the lengths are
    the constant S, or (S None) q's and k's sizes on axis 2 read at run time."""
    if S is None:
        q_len, k_len = _size(b, q, 2), _size(b, k, 2)
        start = b.op("Unsqueeze", [b.op("Sub", [k_len, q_len]), b.i64(0)])
        end = b.op("Unsqueeze", [k_len, b.i64(0)])
        m = b.op("Slice", [bias, start, end, b.i64(2), b.i64(1)])
        return b.op("Slice", [m, b.i64(0), end, b.i64(3), b.i64(1)])
    m = b.op("Slice", [bias, b.i64(0), b.i64(S), b.i64(2), b.i64(1)])
    return b.op("Slice", [m, b.i64(0), b.i64(S), b.i64(3), b.i64(1)])


def _attention(b: GraphBuilder, x: str, bias: str, cfg: dict) -> str:
    """``cfg["seq"]`` None: the sequence length is read from the shapes."""
    H, nh, S = cfg["hidden"], cfg["heads"], cfg["seq"]
    hd = H // nh
    with b.scope("c_attn"):  # Conv1D(3H): MatMul + Add
        qkv = b.linear(x, H, 3 * H, bias_first=False)
    q, k, v = b.op("Split", [qkv, b.i64(H, H, H)], n_out=3, axis=2)
    q, k, v = (_split_heads(b, t, nh, hd) for t in (q, k, v))
    w = b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])])
    w = b.op("Div", [w, b.f32(math.sqrt(hd))])
    w = b.op("Where", [_causal_mask(b, bias, q, k, S), w, b.f32(FLOAT_MIN)])
    w = b.op("Softmax", [w], axis=-1)
    o = b.op("MatMul", [w, v])
    o = b.op("Transpose", [o], perm=[0, 2, 1, 3])  # _merge_heads
    o = b.view(o, ["d0", "d1", H])
    with b.scope("c_proj"):
        return b.linear(o, H, H, bias_first=False)


def _gelu_new(b: GraphBuilder, x: str) -> str:
    """0.5 * x * (1.0 + tanh(sqrt(2 / pi) * (x + 0.044715 * pow(x, 3.0))))"""
    half = b.op("Mul", [b.f32(0.5), x])
    cube = b.op("Pow", [x, b.f32(3.0)])
    inner = b.op("Add", [x, b.op("Mul", [b.f32(0.044715), cube])])
    t = b.op("Tanh", [b.op("Mul", [b.f32(math.sqrt(2.0 / math.pi)), inner])])
    return b.op("Mul", [half, b.op("Add", [b.f32(1.0), t])])


def _block(b: GraphBuilder, x: str, bias: str, cfg: dict) -> str:
    H = cfg["hidden"]
    with b.scope("ln_1"):
        h = b.layer_norm(x, H, LN_EPS)
    with b.scope("attn"):
        h = _attention(b, h, bias, cfg)
    x = b.op("Add", [h, x])
    with b.scope("ln_2"):
        h = b.layer_norm(x, H, LN_EPS)
    with b.scope("mlp"):
        with b.scope("c_fc"):
            h = b.linear(h, H, 4 * H, bias_first=False)
        with b.scope("act"):
            h = _gelu_new(b, h)
        with b.scope("c_proj"):
            h = b.linear(h, 4 * H, H, bias_first=False)
    return b.op("Add", [x, h])


def _transformer(b: GraphBuilder, ids: str, cfg: dict, out: str | None) -> tuple[str, np.ndarray]:
    """GPT2Model; returns the final hidden state (named ``out`` if given) and the wte
    matrix (for the tied LM head). ``cfg["seq"]`` None: the positions run to the input's
    length, read from its shape (torch.arange(0, input_shape[-1]) traced)."""
    S, H = cfg["seq"], cfg["hidden"]
    ids = b.view(ids, [-1, "d1"])  # input_ids.view(-1, input_shape[-1])
    zero = b.const(np.int64(0))
    length = b.const(np.int64(S)) if S is not None else _size(b, ids, 1)
    pos = b.op("Range", [zero, length, b.const(np.int64(1))])
    pos = b.op("Unsqueeze", [pos, b.i64(0)])
    wte = b.randn((cfg["vocab"], H), WTE_STD)
    with b.scope("wte"):
        x = b.op("Gather", [b.param("weight", wte), ids])
    with b.scope("wpe"):
        p = b.op("Gather", [b.param("weight", b.randn((cfg["n_ctx"], H), WPE_STD)), pos])
    x = b.op("Add", [x, p])
    n_ctx = cfg["n_ctx"]
    # The causal-mask buffer (HF registers one per layer; all are equal, so share one).
    tril = np.tril(np.ones((n_ctx, n_ctx), dtype=bool))[None, None]
    bias = b.initializer(f"{b.qualname}.h.0.attn.bias", tril)
    for i in range(cfg["layers"]):
        with b.scope(f"h.{i}"):
            x = _block(b, x, bias, cfg)
    with b.scope("ln_f"):
        x = b.layer_norm(x, H, LN_EPS, outputs=[out] if out else None)
    return x, wte


def build_gpt2(tiny: bool = False, seed: int = 0, lm_head: bool = True,
               dynamic: bool = False) -> onnx.ModelProto:
    """GPT-2 small (or its tiny twin); ``lm_head=False`` outputs ``last_hidden_state``
    instead of ``logits``; ``dynamic``: the sequence axis is the symbolic dimension
    "seq" (1..n_ctx: the position table's and causal mask's rows), as torch.onnx
    exports it with dynamic axes."""
    cfg = TINY if tiny else FULL
    b = GraphBuilder("gpt2", seed)
    H, V = cfg["hidden"], cfg["vocab"]
    S = "seq" if dynamic else cfg["seq"]
    ids = b.input("input_ids", INT64, [1, S])
    with b.scope("transformer"):
        x, wte = _transformer(b, ids, {**cfg, "seq": None} if dynamic else cfg,
                              None if lm_head else "last_hidden_state")
    if lm_head:
        with b.scope("lm_head"):  # tied to wte; the exporter folds wte.T into a constant
            wte_t = b.initializer("lm_head.weight.T", np.ascontiguousarray(wte.T))
            b.op("MatMul", [x, wte_t], outputs=["logits"])
        b.output("logits", FLOAT, [1, S, V])
    else:
        b.output("last_hidden_state", FLOAT, [1, S, H])
    meta = dict(model="gpt2", tiny=int(tiny), seed=seed, vocab_size=V, lm_head=int(lm_head))
    return b.make_model(meta, doc="GPT-2 small (HuggingFace layout), random weights")
