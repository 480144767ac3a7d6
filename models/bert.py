"""BERT-base encoder (HuggingFace BertModel layout, last_hidden_state output)."""

from __future__ import annotations

import math

import numpy as np
import onnx

from ._builder import FLOAT, FLOAT_MIN, INT64, GraphBuilder

FULL = dict(vocab=30522, seq=128, hidden=768, heads=12, layers=12, ffn=3072, max_pos=512,
            type_vocab=2)
TINY = dict(vocab=100, seq=16, hidden=32, heads=2, layers=2, ffn=64, max_pos=32, type_vocab=2)
LN_EPS = 1e-12
EMB_STD = 0.02  # HF initializer_range


def _embeddings(b: GraphBuilder, ids: str, cfg: dict, dynamic: bool = False) -> str:
    S, H = cfg["seq"], cfg["hidden"]
    if dynamic:
        # torch.onnx with a dynamic sequence axis: the registered position_ids buffer
        # sliced to the input's length, zero token types expanded to the input's shape.
        shape = b.op("Shape", [ids])
        length = b.op("Gather", [shape, b.i64(1)])
        table = b.param("position_ids", np.arange(cfg["max_pos"], dtype=np.int64)[None, :])
        pos_ids = b.op("Slice", [table, b.i64(0), length, b.i64(1)])
        type_ids = b.op("Expand", [b.const(np.zeros((1, 1), dtype=np.int64)), shape])
    else:
        # Constant buffers as the exporter folds them: position_ids[:, :S], zero types.
        pos_ids = b.param("position_ids", np.arange(S, dtype=np.int64)[None, :])
        type_ids = b.const(np.zeros((1, S), dtype=np.int64))
    with b.scope("word_embeddings"):
        words = b.op("Gather", [b.param("weight", b.randn((cfg["vocab"], H), EMB_STD)), ids])
    with b.scope("token_type_embeddings"):
        types = b.op("Gather", [b.param("weight", b.randn((cfg["type_vocab"], H), EMB_STD)),
                                type_ids])
    x = b.op("Add", [words, types])
    with b.scope("position_embeddings"):
        pos = b.op("Gather", [b.param("weight", b.randn((cfg["max_pos"], H), EMB_STD)), pos_ids])
    x = b.op("Add", [x, pos])
    with b.scope("LayerNorm"):
        return b.layer_norm(x, H, LN_EPS)


def _extended_mask(b: GraphBuilder, mask: str) -> str:
    """(1.0 - mask[:, None, None, :].float()) * torch.finfo(float32).min"""
    m = b.op("Unsqueeze", [mask, b.i64(1)])
    m = b.op("Unsqueeze", [m, b.i64(2)])
    m = b.op("Cast", [m], to=onnx.TensorProto.FLOAT)
    m = b.op("Sub", [b.f32(1.0), m])
    return b.op("Mul", [m, b.f32(FLOAT_MIN)])


def _self_attention(b: GraphBuilder, x: str, ext_mask: str, cfg: dict) -> str:
    H, nh = cfg["hidden"], cfg["heads"]
    hd = H // nh
    with b.scope("query"):
        q = b.linear(x, H, H)
    with b.scope("key"):
        k = b.linear(x, H, H)
    # transpose_for_scores(key) followed by .transpose(-1, -2): the exporter fuses the
    # two permutations into one Transpose(perm=[0, 2, 3, 1]).
    k = b.op("Transpose", [b.view(k, ["d0", "d1", nh, hd])], perm=[0, 2, 3, 1])
    with b.scope("value"):
        v = b.linear(x, H, H)
    v = b.op("Transpose", [b.view(v, ["d0", "d1", nh, hd])], perm=[0, 2, 1, 3])
    q = b.op("Transpose", [b.view(q, ["d0", "d1", nh, hd])], perm=[0, 2, 1, 3])
    s = b.op("MatMul", [q, k])
    s = b.op("Div", [s, b.f32(math.sqrt(hd))])
    s = b.op("Add", [s, ext_mask])
    p = b.op("Softmax", [s], axis=-1)
    ctx = b.op("MatMul", [p, v])
    ctx = b.op("Transpose", [ctx], perm=[0, 2, 1, 3])
    return b.view(ctx, ["d0", "d1", H])


def _gelu(b: GraphBuilder, x: str) -> str:
    """Exact GELU as exported: x * (Erf(x / sqrt(2)) + 1) * 0.5"""
    e = b.op("Erf", [b.op("Div", [x, b.f32(1.4142135381698608)])])
    e = b.op("Add", [e, b.f32(1.0)])
    return b.op("Mul", [b.op("Mul", [x, e]), b.f32(0.5)])


def _add_norm(b: GraphBuilder, x: str, residual: str, cin: int, H: int, out: str | None) -> str:
    """BertSelfOutput / BertOutput: LayerNorm(dense(x) + residual)."""
    with b.scope("dense"):
        y = b.linear(x, cin, H)
    y = b.op("Add", [y, residual])
    with b.scope("LayerNorm"):
        return b.layer_norm(y, H, LN_EPS, outputs=[out] if out else None)


def _layer(b: GraphBuilder, x: str, ext_mask: str, cfg: dict, out: str | None) -> str:
    H = cfg["hidden"]
    with b.scope("attention"):
        with b.scope("self"):
            a = _self_attention(b, x, ext_mask, cfg)
        with b.scope("output"):
            x = _add_norm(b, a, x, H, H, None)
    with b.scope("intermediate"):
        with b.scope("dense"):
            h = b.linear(x, H, cfg["ffn"])
        with b.scope("intermediate_act_fn"):
            h = _gelu(b, h)
    with b.scope("output"):
        return _add_norm(b, h, x, cfg["ffn"], H, out)


def build_bert_base(tiny: bool = False, seed: int = 0, dynamic: bool = False
                    ) -> onnx.ModelProto:
    """BERT-base (or its tiny twin); `dynamic`: the sequence axis is the symbolic
    dimension "seq" (up to the position table's max_pos), as torch.onnx exports it
    with dynamic axes."""
    cfg = TINY if tiny else FULL
    b = GraphBuilder("bert_base", seed)
    S, H = cfg["seq"], cfg["hidden"]
    S = "seq" if dynamic else S
    ids = b.input("input_ids", INT64, [1, S])
    mask = b.input("attention_mask", INT64, [1, S])
    with b.scope("embeddings"):
        x = _embeddings(b, ids, cfg, dynamic)
    ext_mask = _extended_mask(b, mask)
    with b.scope("encoder"):
        for i in range(cfg["layers"]):
            last = i == cfg["layers"] - 1
            with b.scope(f"layer.{i}"):
                x = _layer(b, x, ext_mask, cfg, "last_hidden_state" if last else None)
    b.output("last_hidden_state", FLOAT, [1, S, H])
    meta = dict(model="bert_base", tiny=int(tiny), seed=seed, vocab_size=cfg["vocab"])
    return b.make_model(meta, doc="BERT-base encoder (HuggingFace layout), random weights")
