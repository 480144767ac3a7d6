"""Attention (opsets 23, 24, 25) and RotaryEmbedding (23) read as decompositions into
catalogue ops, following the ONNX function bodies (onnx 1.23, errata included).

Schema history reviewed (onnx 1.23):
  - Attention-23: Q, K, V, attn_mask, past_key, past_value -> Y, present_key,
    present_value, qk_matmul_output; attributes is_causal, kv_num_heads, q_num_heads,
    qk_matmul_output_mode, scale, softcap, softmax_precision.
  - Attention-24 adds the input nonpad_kv_seqlen (int64 [batch]: an external cache's
    valid length; the causal offset becomes nonpad_kv_seqlen - q_len per batch).
  - Attention-25 adds left_window_size / right_window_size (-1: unbounded).
  - RotaryEmbedding-23 is its only version (X, cos_cache, sin_cache, position_ids;
    interleaved, num_heads, rotary_embedding_dim).

Attention, as read: 3-D inputs (batch, seq, hidden) are split into heads with
q_num_heads / kv_num_heads (Reshape + Transpose), 4-D ones are (batch, heads, seq,
head_size). past_key/past_value are concatenated on the sequence axis (present_key /
present_value are those concatenations). K/V heads are repeated (h0, h0, h1, h1, ...)
when kv heads divide q heads (GQA/MQA). Q and K^T are each scaled by sqrt(scale)
(computed in float32, as the function body, then cast to Q's type), softcap
c * tanh(qk / c) applies when c != 0, then the additive bias, a Softmax on the last axis
(in softmax_precision when given) and MatMul with V. The bias is
  attn_mask (float: added, padded with -inf on the right up to the total kv length;
  bool: True attends, padded with False; integer masks are cast to Q's type)
  + -inf where the causal rule (query i attends key j iff j <= i + offset, offset =
  past length, or nonpad_kv_seqlen - q_len per batch, or 0), the window rule
  (offset + i - left <= j <= offset + i + right) or the padding rule (j <
  nonpad_kv_seqlen) forbids a key.
A row whose bias is -inf everywhere (fully masked) gives probabilities 0 (so Y = 0 and a
mode-3 qk_matmul_output row of 0), as the function body's guard. qk_matmul_output is
mode 0: Q.K^T scaled; 1: after softcap; 2: after softcap and bias; 3: the guarded
softmax, cast back to Q's type (mode 0 with a softcap is the raw product, as the spec and
the function body say; onnx's Python reference returns the softcapped one there).
Adding 0 or -inf is exact in every float type, so the bias is built directly in Q's type
(the function body adds its parts in the mask's type and casts: the same values).

Assumes static shapes (ctx.types). Guarantees: a form outside the spec (heads that do
not divide the hidden size, kv heads that do not divide q heads, mismatched batch or
head sizes, a mask too long or not broadcastable, past with nonpad_kv_seqlen, V of
another type than Q, an unknown qk_matmul_output_mode) is a one-line ModelError.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, label, scalar
from hidetc.frontend.onnx.tensors import dtype_name
from hidetc.graph.ir import FLOAT_DTYPES, TensorType


def _int64(values) -> np.ndarray:
    return np.array(list(values), dtype=np.int64)


@dataclass(frozen=True)
class _Dims:
    """Static sizes of one Attention node, after splitting heads."""
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int      # new keys only
    past_len: int
    head: int        # Q/K head size
    v_head: int
    rank3: bool

    @property
    def total(self) -> int:
        return self.past_len + self.kv_len


def _fail(node: OnnxNode, message: str) -> ModelError:
    return ModelError(f"{label(node)}: {message}")


def _type(node: OnnxNode, ctx: Context, index: int) -> TensorType | None:
    name = node.input(index)
    return ctx.types[name] if name else None


def _heads_3d(node: OnnxNode, what: str, t: TensorType, heads: int) -> int:
    if heads <= 0 or t.shape[2] % heads:
        raise _fail(node, f"input {what} hidden size {t.shape[2]} is not a multiple of "
                          f"the number of heads {heads}")
    return t.shape[2] // heads


def _dims(node: OnnxNode, ctx: Context) -> _Dims:
    q, k, v = (_type(node, ctx, i) for i in range(3))
    if not q.rank == k.rank == v.rank or q.rank not in (3, 4):
        raise _fail(node, f"Q, K, V must all be 3-D or all 4-D, got ranks "
                          f"{q.rank}, {k.rank}, {v.rank}")
    attrs = node.attrs
    if q.rank == 3:
        if "q_num_heads" not in attrs or "kv_num_heads" not in attrs:
            raise _fail(node, "3-D inputs need the q_num_heads and kv_num_heads attributes")
        qh, kvh = int(attrs["q_num_heads"]), int(attrs["kv_num_heads"])
        head, k_head = _heads_3d(node, "Q", q, qh), _heads_3d(node, "K", k, kvh)
        v_head = _heads_3d(node, "V", v, kvh)
        q_len, kv_len, v_len = q.shape[1], k.shape[1], v.shape[1]
    else:
        qh, kvh, head, k_head, v_head = q.shape[1], k.shape[1], q.shape[3], k.shape[3], \
            v.shape[3]
        q_len, kv_len, v_len = q.shape[2], k.shape[2], v.shape[2]
        for attr, want, what in (("q_num_heads", qh, "Q"), ("kv_num_heads", kvh, "K")):
            if attr in attrs and int(attrs[attr]) != want:
                raise _fail(node, f"{attr}={attrs[attr]} but 4-D input {what} has {want} "
                                  f"heads")
        if v.shape[1] != kvh:
            raise _fail(node, f"V has {v.shape[1]} heads, K has {kvh}")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise _fail(node, f"Q, K, V batch sizes differ: {q.shape[0]}, {k.shape[0]}, "
                          f"{v.shape[0]}")
    if k_head != head:
        raise _fail(node, f"K head size {k_head} differs from Q head size {head}")
    if v_len != kv_len:
        raise _fail(node, f"K has {kv_len} positions, V has {v_len}")
    if qh % kvh:
        raise _fail(node, f"kv heads ({kvh}) must divide q heads ({qh})")
    past = _past_len(node, ctx, (q.shape[0], kvh, head, v_head))
    return _Dims(q.shape[0], qh, kvh, q_len, kv_len, past, head, v_head, q.rank == 3)


def _past_len(node: OnnxNode, ctx: Context, dims: tuple[int, int, int, int]) -> int:
    pk, pv = _type(node, ctx, 4), _type(node, ctx, 5)
    if pk is None and pv is None:
        return 0
    if pk is None or pv is None:
        raise _fail(node, "past_key and past_value must be given together")
    if node.input(6):
        raise _fail(node, "nonpad_kv_seqlen cannot be combined with past_key/past_value")
    batch, kvh, head, v_head = dims
    past = pk.shape[2] if pk.rank == 4 else -1
    if pk.shape != (batch, kvh, past, head) or pv.shape != (batch, kvh, past, v_head):
        raise _fail(node, f"past_key {list(pk.shape)} and past_value {list(pv.shape)} must "
                          f"be [{batch}, {kvh}, past, {head}] and [{batch}, {kvh}, past, "
                          f"{v_head}]")
    return past


def _split_heads(build: Builder, x: str, dims: _Dims, heads: int, length: int) -> str:
    """(b, s, h*d) -> (b, h, s, d) for 3-D inputs; 4-D inputs as they are."""
    if not dims.rank3:
        return x
    split = build.add("Reshape", [x, build.const("heads", _int64((dims.batch, length, heads,
                                                                    -1)))])
    return build.add("Transpose", [split], perm=(0, 2, 1, 3))


def _present(build: Builder, node: OnnxNode, x: str, index: int) -> str:
    """Concatenate past input `index` (4 or 5) before x; write the present output."""
    past = node.input(index)
    full = build.add("Concat", [past, x], axis=2) if past else x
    out = node.outputs[index - 3] if len(node.outputs) > index - 3 else ""
    if out and out in build.ctx.used:
        build.add("Identity", [full], out=out)
    return full


def _repeat_heads(build: Builder, x: str, dims: _Dims, head: int) -> str:
    reps = dims.q_heads // dims.kv_heads
    if reps == 1:
        return x
    b, kvh, s = dims.batch, dims.kv_heads, dims.total
    grouped = build.add("Reshape", [x, build.const("group", _int64((b, kvh, 1, s, head)))])
    wide = build.add("Expand", [grouped, build.const("repeat", _int64((b, kvh, reps, s, head)))])
    return build.add("Reshape", [wide, build.const("heads", _int64((b, dims.q_heads, s, head)))])


def _positions(node: OnnxNode, dims: _Dims) -> tuple[np.ndarray, bool]:
    """diff = query position + offset - key position: (q, total) when the offset is
    static, else (q, total) of (i - q_len - j) to which nonpad_kv_seqlen[b] is added."""
    i = np.arange(dims.q_len, dtype=np.int64).reshape(-1, 1)
    j = np.arange(dims.total, dtype=np.int64).reshape(1, -1)
    if node.input(6):
        return i - dims.q_len - j, True
    return i + dims.past_len - j, False


def _rules(node: OnnxNode) -> list[tuple[str, int]]:
    """(comparison, bound) pairs on diff that forbid a key."""
    rules = []
    if int(node.attrs.get("is_causal", 0)):
        rules.append(("Less", 0))
    left = int(node.attrs.get("left_window_size", -1))
    right = int(node.attrs.get("right_window_size", -1))
    for size, what in ((left, "left_window_size"), (right, "right_window_size")):
        if size < -1:
            raise _fail(node, f"{what} must be -1 or >= 0, got {size}")
    if left >= 0:
        rules.append(("Greater", left))
    if right >= 0:
        rules.append(("Less", -right))
    return rules


_COMPARE = {"Less": np.less, "Greater": np.greater}


def _forbidden(build: Builder, node: OnnxNode, dims: _Dims) -> list[str | np.ndarray]:
    """Boolean 'key forbidden' terms of the causal, window and padding rules: numpy
    arrays when static, value names when they depend on nonpad_kv_seqlen."""
    diff, per_batch = _positions(node, dims)
    rules = _rules(node)
    if not per_batch:
        return [_COMPARE[op](diff, bound) for op, bound in rules]
    seqlen = node.input(6)
    t = build.ctx.types[seqlen]
    if t.dtype != "int64" or t.shape != (dims.batch,):
        raise _fail(node, f"nonpad_kv_seqlen must be int64 [{dims.batch}], got {t.dtype} "
                          f"{list(t.shape)}")
    lengths = build.add("Reshape", [seqlen, build.const("lengths", _int64((-1, 1, 1, 1)))])
    terms: list[str | np.ndarray] = []
    if rules:
        shifted = build.add("Add", [lengths, build.const("positions", diff)])
        terms += [build.add(op, [shifted, build.const("bound", scalar(bound, "int64"))])
                  for op, bound in rules]
    keys = build.const("keys", np.arange(dims.total, dtype=np.int64))
    terms.append(build.add("GreaterOrEqual", [keys, lengths]))
    return terms


def _mask(build: Builder, node: OnnxNode, dims: _Dims, dtype: str
          ) -> tuple[str | None, str | None]:
    """The attn_mask input read as (float bias or None, forbidden bool or None)."""
    name = node.input(3)
    if not name:
        return None, None
    t = build.ctx.types[name]
    full = (dims.batch, dims.q_heads, dims.q_len, dims.total)
    shape = t.shape
    ok = 1 <= len(shape) <= 4 and shape[-1] <= dims.total and all(
        s in (1, f) for s, f in zip(shape[::-1][1:], full[::-1][1:]))
    if not ok:
        raise _fail(node, f"attn_mask {list(shape)} is not broadcastable to {list(full)} "
                          f"(its last axis may be shorter)")
    pad = dims.total - shape[-1]
    if t.dtype == "bool":
        forbidden = build.add("Not", [name])
        if pad:
            fill = build.const("mask_pad", np.ones(shape[:-1] + (pad,), dtype=bool))
            forbidden = build.add("Concat", [forbidden, fill], axis=-1)
        return None, forbidden
    bias = name if t.dtype == dtype else build.add("Cast", [name], to=dtype)
    if pad:
        fill = build.const("mask_pad", np.full(shape[:-1] + (pad,), -np.inf).astype(dtype))
        bias = build.add("Concat", [bias, fill], axis=-1)
    return bias, None


def _bias(build: Builder, node: OnnxNode, dims: _Dims, dtype: str
          ) -> tuple[str | None, np.ndarray | None]:
    """The additive bias (value name, or None when there is none) and, when the bias is
    static, which query rows are fully masked (else None: decided at run time)."""
    bias, forbidden = _mask(build, node, dims, dtype)
    terms = _forbidden(build, node, dims)
    static = [t for t in terms if isinstance(t, np.ndarray)]
    names = [t for t in terms if isinstance(t, str)] + ([forbidden] if forbidden else [])
    fixed = np.logical_or.reduce(static) if static else np.zeros((1, 1), dtype=bool)
    if not names and bias is None:
        if not fixed.any():
            return None, None
        values = np.where(fixed, -np.inf, 0.0).astype(np.dtype(dtype))
        return build.const("bias", values), fixed.all(axis=-1, keepdims=True)
    if fixed.any():
        names.append(build.const("forbidden", fixed))
    if names:
        cond = names[0]
        for other in names[1:]:
            cond = build.add("Or", [cond, other])
        inf = build.add("Where", [cond, build.const("neg_inf", scalar(-np.inf, dtype)),
                                  build.const("zero", scalar(0.0, dtype))])
        bias = build.add("Add", [bias, inf]) if bias else inf
    return bias, None


def _scale(node: OnnxNode, dims: _Dims, dtype: str) -> np.ndarray:
    """sqrt(scale) computed in float32 (as the function body), cast to `dtype`."""
    if "scale" in node.attrs:
        scale = np.float32(node.attrs["scale"])
    else:
        scale = np.float32(1.0) / np.sqrt(np.float32(dims.head))
    return scalar(np.sqrt(scale), dtype)


def _probabilities(build: Builder, node: OnnxNode, scores: str, dtype: str) -> str:
    precision = node.attrs.get("softmax_precision")
    wide = dtype if precision is None else dtype_name(int(precision),
                                                      f"{label(node)} softmax_precision")
    if wide not in FLOAT_DTYPES:
        raise _fail(node, f"softmax_precision must be a float type, got {wide}")
    if wide != dtype:
        scores = build.add("Cast", [scores], to=wide)
    probs = build.add("Softmax", [scores], axis=-1)
    return probs if wide == dtype else build.add("Cast", [probs], to=dtype)


def _guard(build: Builder, probs: str, bias: str | None, rows: np.ndarray | None,
           dtype: str) -> str:
    """Zero the probabilities of fully-masked rows (the function body's guard)."""
    if bias is None or (rows is not None and not rows.any()):
        return probs   # no bias, or a static one that leaves a key in every row
    if rows is None:   # 16-bit biases are widened first (exact): the max runs in float32
        wide = "float32" if dtype in ("float16", "bfloat16") else dtype
        if wide != dtype:
            bias = build.add("Cast", [bias], to=wide)
        top = build.add("ReduceMax", [bias, build.const("last", _int64((-1,)))], keepdims=1)
        rows = build.add("Equal", [top, build.const("neg_inf", scalar(-np.inf, wide))])
    else:
        rows = build.const("masked_rows", rows)
    return build.add("Where", [rows, build.const("zero", scalar(0.0, dtype)), probs])


def attention(node: OnnxNode, ctx: Context) -> Converted:
    dims = _dims(node, ctx)
    dtype = ctx.types[node.inputs[0]].dtype
    if dtype not in FLOAT_DTYPES or ctx.types[node.inputs[2]].dtype != dtype or \
            ctx.types[node.inputs[1]].dtype != dtype:
        raise _fail(node, f"Q, K, V must share one float type, got "
                          f"{[ctx.types[i].dtype for i in node.inputs[:3]]}")
    mode = int(node.attrs.get("qk_matmul_output_mode", 0))
    if mode not in (0, 1, 2, 3):
        raise _fail(node, f"qk_matmul_output_mode must be 0..3, got {mode}")
    build = Builder(node, ctx)
    q = _split_heads(build, node.inputs[0], dims, dims.q_heads, dims.q_len)
    k = _present(build, node, _split_heads(build, node.inputs[1], dims, dims.kv_heads,
                                           dims.kv_len), 4)
    v = _present(build, node, _split_heads(build, node.inputs[2], dims, dims.kv_heads,
                                           dims.kv_len), 5)
    k, v = _repeat_heads(build, k, dims, dims.head), _repeat_heads(build, v, dims, dims.v_head)
    root = build.const("scale", _scale(node, dims, dtype))
    kt = build.add("Transpose", [k], perm=(0, 1, 3, 2))
    stages = [build.add("MatMul", [build.add("Mul", [q, root]), build.add("Mul", [kt, root])])]
    softcap = float(node.attrs.get("softcap", 0.0))
    scores = stages[0]
    if softcap != 0.0:
        cap = build.const("softcap", scalar(np.float32(softcap), dtype))
        scores = build.add("Mul", [build.add("Tanh", [build.add("Div", [scores, cap])]), cap])
    stages.append(scores)
    bias, rows = _bias(build, node, dims, dtype)
    if bias is not None:
        scores = build.add("Add", [scores, bias])
    stages.append(scores)
    probs = _guard(build, _probabilities(build, node, scores, dtype), bias, rows, dtype)
    stages.append(probs)
    out = node.outputs[3] if len(node.outputs) > 3 else ""
    if out and out in ctx.used:
        build.add("Identity", [stages[mode]], out=out)
    _output(build, node, dims, build.add("MatMul", [probs, v],
                                         out=None if dims.rank3 else node.outputs[0]))
    return build.done()


def _output(build: Builder, node: OnnxNode, dims: _Dims, y: str) -> None:
    if dims.rank3:
        merged = build.add("Transpose", [y], perm=(0, 2, 1, 3))
        shape = _int64((dims.batch, dims.q_len, dims.q_heads * dims.v_head))
        build.add("Reshape", [merged, build.const("shape", shape)], out=node.outputs[0])


def _rotary_dims(node: OnnxNode, ctx: Context) -> tuple[int, int, int, int]:
    """(batch, seq, heads, head size) of RotaryEmbedding's input."""
    x = ctx.types[node.inputs[0]]
    if x.rank == 4:
        return x.shape[0], x.shape[2], x.shape[1], x.shape[3]
    if x.rank != 3:
        raise _fail(node, f"input must be 3-D or 4-D, got rank {x.rank}")
    heads = int(node.attrs.get("num_heads", 0))
    if heads <= 0 or x.shape[2] % heads:
        raise _fail(node, f"a 3-D input needs num_heads dividing its hidden size "
                          f"{x.shape[2]}, got num_heads={heads}")
    return x.shape[0], x.shape[1], heads, x.shape[2] // heads


def _cache(build: Builder, node: OnnxNode, index: int, dims: tuple[int, int], half: int
           ) -> str:
    """cos/sin cache gathered by position_ids, sliced to rotary_dim/2, as (b, s, 1, half)."""
    name, types = node.inputs[index], build.ctx.types
    shape, positions = types[name].shape, node.input(3)
    if positions:
        ok = len(shape) == 2 and types[positions].shape == dims
        want = f"[max_position, >={half}] with position_ids {list(dims)}"
    else:
        ok = len(shape) == 3 and shape[:2] == dims
        want = f"[{dims[0]}, {dims[1]}, >={half}] (no position_ids)"
    if not ok or shape[-1] < half:
        got = f" and position_ids {list(types[positions].shape)}" if positions else ""
        raise _fail(node, f"input {name} must be {want}, got {list(shape)}{got}")
    if positions:
        name = build.add("Gather", [name, positions], axis=0)
    if shape[-1] != half:
        name = build.add("Slice", [name, build.const("start", _int64((0,))),
                                   build.const("end", _int64((half,))),
                                   build.const("axis", _int64((2,)))])
    return build.add("Reshape", [name, build.const("shape", _int64(dims + (1, half)))])


def _slice(build: Builder, x: str, start: int, end: int, step: int = 1) -> str:
    return build.add("Slice", [x, build.const("start", _int64((start,))),
                               build.const("end", _int64((end,))),
                               build.const("axis", _int64((3,))),
                               build.const("step", _int64((step,)))])


def rotary_embedding(node: OnnxNode, ctx: Context) -> Converted:
    batch, seq, heads, head = _rotary_dims(node, ctx)
    x_type = ctx.types[node.inputs[0]]
    rot = int(node.attrs.get("rotary_embedding_dim", 0)) or head
    if rot % 2 or not 0 < rot <= head:
        raise _fail(node, f"rotary_embedding_dim must be even and at most the head size "
                          f"{head}, got {rot}")
    half, interleaved = rot // 2, bool(node.attrs.get("interleaved", 0))
    build = Builder(node, ctx)
    x = node.inputs[0]
    if x_type.rank == 4:
        x = build.add("Transpose", [x], perm=(0, 2, 1, 3))
    else:
        x = build.add("Reshape", [x, build.const("heads", _int64((batch, seq, heads, head)))])
    cos, sin = (_cache(build, node, i, (batch, seq), half) for i in (1, 2))
    if interleaved:
        x1, x2 = _slice(build, x, 0, rot, 2), _slice(build, x, 1, rot, 2)
    else:
        x1, x2 = _slice(build, x, 0, half), _slice(build, x, half, rot)
    real = build.add("Sub", [build.add("Mul", [cos, x1]), build.add("Mul", [sin, x2])])
    imag = build.add("Add", [build.add("Mul", [sin, x1]), build.add("Mul", [cos, x2])])
    if interleaved:
        pair = _int64((batch, seq, heads, half, 1))
        real, imag = (build.add("Reshape", [p, build.const("pair", pair)]) for p in (real, imag))
        rotated = build.add("Reshape", [build.add("Concat", [real, imag], axis=-1),
                                        build.const("rotated", _int64((batch, seq, heads, rot)))])
    else:
        rotated = build.add("Concat", [real, imag], axis=-1)
    if rot < head:
        rotated = build.add("Concat", [rotated, _slice(build, x, rot, head)], axis=-1)
    if x_type.rank == 4:
        build.add("Transpose", [rotated], perm=(0, 2, 1, 3), out=node.outputs[0])
    else:
        build.add("Reshape", [rotated, build.const("shape", _int64(x_type.shape))],
                  out=node.outputs[0])
    return build.done()


HANDLERS = {"Attention": attention, "RotaryEmbedding": rotary_embedding}
EXTRA_OPS: tuple[str, ...] = ("Attention", "RotaryEmbedding")
CHECKED: tuple[str, ...] = ("Attention", "RotaryEmbedding")
FIRST_VERSION: dict[str, int] = {"Attention": 23, "RotaryEmbedding": 23}
