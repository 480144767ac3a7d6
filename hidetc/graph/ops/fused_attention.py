"""FusedAttention (ANCHOR), introduced by the `fuse_attention` graph pass for the cuda
target (never by the frontend, and not ONNX's Attention): softmax(score(Q @ Kt)) @ V as
one op, `score` being the elementwise steps between the two MatMuls that the pass
folded in.

FusedAttention(Q, Kt, V, E0, E1, ...) -> O: Q [..., Sq, D], Kt [..., D, Sk], V
[..., Sk, Dv] (batch dims broadcast, numpy's MatMul rules), O [..., Sq, Dv]. Attribute
`score`: steps applied in order to each score s, each computed in float32 from the
storage dtype and rounded back to it (exactly what the unfused ops store):
  ("div", c) -> s / c        ("mul", c) -> s * c          (c a float constant)
  ("add", i) -> s + E_i      (E_i broadcast to the scores' shape)
  ("where", i, c) -> E_i ? s : c   (E_i bool, broadcast; c a float constant)
then a softmax along the keys (float32, rounded) and the product with V (float32
accumulation, rounded). Guarantees: the reference is the unfused ops' references in
order, so the op and the subgraph it replaces agree exactly.
"""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import TensorType
from hidetc.graph.ops.common import arity, broadcast, fail, fmt
from hidetc.graph.ops.registry import OpKind, define

OP = "FusedAttention"
STEPS = ("div", "mul", "add", "where")


def _infer(types, attrs, values):
    arity(OP, types, 3, 3 + 16)
    q, kt, v = types[0], types[1], types[2]
    if len(q.shape) < 2 or len(kt.shape) < 2 or len(v.shape) < 2:
        fail(OP, "Q, Kt and V need at least 2 dims")
    if q.dtype != kt.dtype or q.dtype != v.dtype:
        fail(OP, f"Q, Kt and V must share a dtype, got {q.dtype}, {kt.dtype}, {v.dtype}")
    if q.shape[-1] != kt.shape[-2] or kt.shape[-1] != v.shape[-2]:
        fail(OP, f"Q {fmt(q.shape)} x Kt {fmt(kt.shape)} x V {fmt(v.shape)}: inner dims "
                 "do not match")
    batch = broadcast(OP, [q.shape[:-2], kt.shape[:-2], v.shape[:-2]])   # (symbolic too)
    scores = tuple(batch) + (q.shape[-2], kt.shape[-1])
    for step in attrs.get("score", ()):
        if step[0] not in STEPS:
            fail(OP, f"unknown score step {step!r}")
        if step[0] in ("add", "where"):
            extra = types[3 + step[1]]
            if len(extra.shape) > len(scores) or any(
                    e != 1 and e != s for e, s in zip(reversed(extra.shape), reversed(scores))):
                fail(OP, f"score input {step[1]} {fmt(extra.shape)} does not broadcast to "
                         f"the scores {fmt(scores)}")
    return [TensorType(q.dtype, tuple(batch) + (q.shape[-2], v.shape[-1]))]


def scores_then_softmax(s: np.ndarray, extras: list, steps, dtype) -> np.ndarray:
    """The unfused ops between the MatMuls, in their order and rounding: `s` (rounded
    scores) -> the score steps -> softmax along the last axis, in `dtype`."""
    for step in steps:
        wide = s.astype(np.float32)
        if step[0] == "div":
            wide = wide / np.float32(step[1])
        elif step[0] == "mul":
            wide = wide * np.float32(step[1])
        elif step[0] == "add":
            wide = wide + extras[step[1]].astype(np.float32)
        else:
            wide = np.where(extras[step[1]].astype(bool), wide, np.float32(step[2]))
        s = wide.astype(dtype)
    wide = s.astype(np.float32)
    e = np.exp(wide - wide.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(dtype)


def _reference(inputs, attrs):
    q, kt, v = inputs[0], inputs[1], inputs[2]
    dtype = q.dtype
    s = np.matmul(q.astype(np.float32), kt.astype(np.float32)).astype(dtype)
    p = scores_then_softmax(s, list(inputs[3:]), attrs.get("score", ()), dtype)
    return [np.matmul(p.astype(np.float32), v.astype(np.float32)).astype(dtype)]


define(OP, OpKind.ANCHOR, _infer, _reference)
