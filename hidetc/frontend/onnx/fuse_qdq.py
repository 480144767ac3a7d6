"""Rewrite ONNX Runtime's QDQ quantized patterns into integer ONNX ops (ONNX -> ONNX),
computing what ONNX Runtime's CPU provider computes when it fuses them into its kernels.

`quantize_static(..., QuantFormat.QDQ)` writes Conv / MatMul / Gemm reading
DequantizeLinear (DQ) outputs, their outputs going to a QuantizeLinear (Q). x_q below is
a uint8/int8 activation (any producer) with constant per-tensor scale xs and zero point
xz; w_q an int8/uint8 constant weight with scales ws and zero points wz per tensor or per
output channel; y = Q(., ys, yz) with constant per-tensor ys and yz.

1. Conv(DQ(x_q), DQ(w_q) [, DQ(b int32)]) -> Q, as QLinearConv: acc = ConvInteger(x_q,
   w_q, xz, wz) [+ b, an int32 Add], y = QuantizeLinear(float32(acc) * M, 1.0, yz) with
   the float32 multiplier M = (xs * ws) / ys per output channel: the kernel's
   requantization, rounding half to even, adding yz and saturating.
2. MatMul(DQ(a_q), DQ(b_q)) -> Q, as QLinearMatMul: the same with MatMulInteger; b_q a
   constant (per-tensor, or per column of a 2-D [K, N] b) or a runtime tensor quantized
   per tensor (attention's Q.K^T and P.V).
3. MatMul(DQ(a_q), DQ(b_q)) with no Q after it, as MatMulIntegerToFloat:
   y = float32(MatMulInteger(a_q, b_q, az, bz)) * S, S = as * bs in float32.
4. Gemm(DQ(a_q), DQ(w_q) [, DQ(c int32)]), alpha = beta = 1, transA = 0, as QGemm:
   pattern 2 or 3, w_q transposed at rewrite time when transB = 1, the int32 bias added to
   the accumulator before the scaling (also without a Q after the Gemm).

The conditions are those of ONNX Runtime's QDQ selectors where int8 is allowed (Arm, or
session option `session.qdqisint8allowed`): y's type is x's, an int8 x needs an int8
weight, a fused output has no other use, and a Relu / Clip before the Q is dropped where
the Q makes it redundant. On x86 ORT computes an int8 activation in float unless its
Q -> DQ pair can be turned into uint8. Stricter than ORT: a bias needs a zero zero point
and a scale float32(xs * ws) to 1 ulp (ORT 1.32 allows ~1 % for Conv, ignores Gemm's
bias scale), and a Conv weight must be a constant (ORT also fuses a runtime one). Q/DQ with
block_size, non-float32 scales or other types are not matched; outside the patterns
nothing changes. DQ nodes (and Constants) that only fused nodes used are removed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

_QTYPES = (TensorProto.UINT8, TensorProto.INT8)
_RANGE = {TensorProto.UINT8: (0, 255), TensorProto.INT8: (-128, 127)}
_CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
_DOMAINS = ("", "ai.onnx")


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _inputs(node: onnx.NodeProto, n: int) -> list[str]:
    return (list(node.input) + [""] * n)[:n]


def _names(graph: onnx.GraphProto, names: set[str], refs: set[str], top: bool = True) -> None:
    """Every name of `graph` and its subgraphs into `names`; subgraph inputs into `refs`."""
    for v in (*graph.input, *graph.output, *graph.value_info, *graph.initializer):
        names.add(v.name)
    if not top:
        refs.update(o.name for o in graph.output)
    for node in graph.node:
        names.update((*node.input, *node.output, node.name))
        if not top:
            refs.update(node.input)
        for a in node.attribute:
            for sub in (*a.graphs, *([a.g] if a.HasField("g") else [])):
                _names(sub, names, refs, top=False)


@dataclass
class _Dq:
    """A DequantizeLinear with constant scale and zero point."""

    q: str  # the quantized input
    qtype: int
    scale: np.ndarray  # float32
    zp: np.ndarray  # zeros when absent
    zp_name: str  # "" when absent
    axis: int
    value: np.ndarray | None  # q's value when it is a constant

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1 and self.zp.size == 1

    def per_axis(self, axis: int, n: int) -> bool:
        """Per-tensor, or per-axis along `axis` (of the constant value) with n channels."""
        if self.per_tensor:
            return True
        return (self.scale.ndim == 1 and self.scale.size == n and self.zp.size == n
                and self.axis % self.value.ndim == axis)


def _bias_ok(b: _Dq | None, xs: np.ndarray, ws: np.ndarray, n: int) -> bool:
    """An int32 constant of n values, zero zero point, scale float32(xs * ws) +- 1 ulp."""
    if b is None or b.value is None or b.value.size != n or np.any(b.zp != 0):
        return False
    if b.scale.size not in (1, n):
        return False
    want = np.broadcast_to(xs.reshape(-1)[0] * ws.reshape(-1), (n,))
    have = np.broadcast_to(b.scale.reshape(-1), (n,))
    return bool(np.all(np.abs(have - want) <= np.spacing(np.abs(want))))


class _Fuser:
    def __init__(self, proto: onnx.ModelProto, base_dir: str | None):
        g = self.graph = proto.graph
        self.base_dir = base_dir or ""
        inputs = {v.name for v in g.input}
        self.inits = {t.name: t for t in g.initializer if t.name not in inputs}
        self.producer = {o: n for n in g.node for o in n.output if o}
        self.uses: dict[str, list[onnx.NodeProto]] = {}
        for n in g.node:
            for i in dict.fromkeys(n.input):
                self.uses.setdefault(i, []).append(n)
        self.taken: set[str] = set()
        refs: set[str] = set()
        _names(g, self.taken, refs)
        self.pinned = {o.name for o in g.output} | refs
        self.types = {v.name: v.type.tensor_type.elem_type
                      for v in (*g.input, *g.value_info, *g.output)}
        self.new_inits: list[onnx.TensorProto] = []
        self._one = ""

    # --- constants and names -------------------------------------------------------------
    def _tensor(self, name: str) -> onnx.TensorProto | None:
        if name in self.inits:
            return self.inits[name]
        node = self.producer.get(name)
        if node is not None and node.op_type == "Constant" and node.domain in _DOMAINS:
            value = _attr(node, "value")
            return value if isinstance(value, onnx.TensorProto) else None
        return None

    def const(self, name: str) -> np.ndarray | None:
        t = self._tensor(name)
        return None if t is None else numpy_helper.to_array(t, self.base_dir)

    def elem_type(self, name: str) -> int:
        t = self._tensor(name)
        if t is not None:
            return t.data_type
        node = self.producer.get(name)
        if node is not None and node.op_type == "QuantizeLinear" and node.domain in _DOMAINS:
            zp = _inputs(node, 3)[2]
            return self.elem_type(zp) if zp else _attr(node, "output_dtype", 0) or _QTYPES[0]
        return self.types.get(name, 0)

    def fresh(self, base: str) -> str:
        name, i = base, 0
        while name in self.taken:
            i += 1
            name = f"{base}_{i}"
        self.taken.add(name)
        return name

    def add_init(self, base: str, value: np.ndarray) -> str:
        name = self.fresh(base)
        self.new_inits.append(numpy_helper.from_array(value, name))
        return name

    # --- matching -------------------------------------------------------------------------
    def dq(self, name: str, types=_QTYPES) -> _Dq | None:
        node = self.producer.get(name)
        if node is None or node.op_type != "DequantizeLinear" or node.domain not in _DOMAINS:
            return None
        if _attr(node, "block_size", 0) or _attr(node, "output_dtype", 0) not in (0, 1):
            return None
        q, s, z = _inputs(node, 3)
        scale = self.const(s)
        if scale is None or scale.dtype != np.float32 or scale.ndim > 1:
            return None
        qtype = self.elem_type(z) if z else self.elem_type(q)
        zp = self.const(z) if z else np.zeros(scale.shape, np.int32)
        if qtype not in types or zp is None or zp.size != scale.size or zp.ndim > 1:
            return None
        return _Dq(q, qtype, scale, zp, z, _attr(node, "axis", 1), self.const(q))

    def operands(self, node: onnx.NodeProto) -> tuple[_Dq, _Dq] | None:
        x, w = self.dq(node.input[0]), self.dq(node.input[1])
        if x is None or w is None or not x.per_tensor:
            return None
        if x.qtype == TensorProto.INT8 and w.qtype != TensorProto.INT8:
            return None
        return x, w

    def edges(self, name: str) -> int:
        return sum(list(u.input).count(name) for u in self.uses.get(name, []))

    def clip_after(self, out: str) -> onnx.NodeProto | None:
        """The Relu / Clip, `out`'s one use, through which ORT looks for the Q."""
        node = self.uses[out][0] if self.edges(out) == 1 else None
        if node is None or node.op_type not in ("Relu", "Clip") or node.domain not in _DOMAINS:
            return None
        clipped = node.output[0]
        return node if self.edges(clipped) == 1 and clipped not in self.pinned else None

    def redundant(self, clip: onnx.NodeProto, ys: np.ndarray, yz: np.ndarray, ytype) -> bool:
        """Whether Q(., ys, yz) clips at least as much as `clip` (ORT's test: rank-0 ys, yz)."""
        lo, hi = _RANGE[ytype]
        if ys.ndim or yz.ndim or clip.op_type == "Relu":
            return not ys.ndim and not yz.ndim and int(yz) == lo
        names = _inputs(clip, 3)[1:]
        bounds = [self.const(n) if n else None for n in names]  # Clip-11+: inputs
        if len(clip.input) < 2:  # Clip-6: attributes
            bounds = [_attr(clip, "min"), _attr(clip, "max")]
        elif any(n and b is None for n, b in zip(names, bounds)):
            return False
        cmin = -np.inf if bounds[0] is None else np.rint(np.float32(bounds[0]) / ys) + int(yz)
        cmax = np.inf if bounds[1] is None else np.rint(np.float32(bounds[1]) / ys) + int(yz)
        return cmin <= lo and cmax >= hi

    def requant(self, x: _Dq, out: str):
        """(Q, ys, dropped Relu/Clip or None): the Q, `out`'s one use (through a redundant
        Relu/Clip), quantizing per tensor to x's type."""
        clip = self.clip_after(out)
        value = clip.output[0] if clip is not None else out
        q = self.uses[value][0] if self.edges(value) == 1 else None
        if out in self.pinned or value in self.pinned or q is None or q.input[0] != value:
            return None
        if q.op_type != "QuantizeLinear" or q.domain not in _DOMAINS or _attr(q, "block_size", 0):
            return None
        _, s, z = _inputs(q, 3)
        ys = self.const(s)
        yz = self.const(z) if z else np.zeros((), np.uint8)
        ytype = self.elem_type(q.output[0])
        if ys is None or ys.dtype != np.float32 or ys.size != 1 or yz is None or yz.size != 1:
            return None
        if ytype != x.qtype or clip is not None and not self.redundant(clip, ys, yz, ytype):
            return None
        return q, ys.reshape(-1)[0], clip

    def feeds_q(self, out: str) -> bool:
        """Whether ORT looks for a Q after `out` (and so does not fuse it to a float output)."""
        if self.clip_after(out) is not None:
            return True
        return any(u.op_type == "QuantizeLinear" for u in self.uses.get(out, []))

    # --- emission -------------------------------------------------------------------------
    def weight_zp(self, w: _Dq, base: str) -> str:
        """w's zero point: as it is, or one scalar when all per-channel values are equal
        (ORT's ConvInteger takes a scalar one only)."""
        if not w.zp_name or w.zp.size == 1 or np.any(w.zp != w.zp.reshape(-1)[0]):
            return w.zp_name
        return self.add_init(f"{base}_w_zero_point", w.zp.reshape(-1)[0].copy())

    def emit(self, base: str, op: str, ins: list[str], attrs: dict, bias: np.ndarray | None,
             mult: np.ndarray, out: str, q: onnx.NodeProto | None) -> list[onnx.NodeProto]:
        """op(ins) [+ bias], Cast to float, Mul by mult, then a copy of q (scale 1) or `out`."""
        while ins and not ins[-1]:
            ins.pop()
        acc = self.fresh(f"{base}_acc")
        nodes = [helper.make_node(op, ins, [acc], self.fresh(f"{base}_int"), **attrs)]
        if bias is not None:
            b_name = self.add_init(f"{base}_bias_int32", bias.astype(np.int32))
            summed = self.fresh(f"{base}_acc_bias")
            nodes.append(helper.make_node("Add", [acc, b_name], [summed],
                                          self.fresh(f"{base}_bias")))
            acc = summed
        f = self.fresh(f"{base}_float")
        nodes.append(helper.make_node("Cast", [acc], [f], self.fresh(f"{base}_cast"),
                                      to=TensorProto.FLOAT))
        m_name = self.add_init(f"{base}_multiplier", mult)
        v = self.fresh(f"{base}_scaled") if q is not None else out
        nodes.append(helper.make_node("Mul", [f, m_name], [v], self.fresh(f"{base}_mul")))
        if q is not None:
            new_q = onnx.NodeProto()
            new_q.CopyFrom(q)
            self._one = self._one or self.add_init("qdq_one", np.array(1.0, np.float32))
            new_q.input[0], new_q.input[1] = v, self._one
            new_q.name = q.name or self.fresh(f"{base}_quant")
            nodes.append(new_q)
        return nodes

    @staticmethod
    def multiplier(xs: np.ndarray, ws: np.ndarray, ys, shape: list[int]) -> np.ndarray:
        """float32 (xs * ws) [/ ys], in that order as the kernels compute it."""
        m = xs.reshape(-1)[0] * ws.reshape(-1)
        if ys is not None:
            m = m / ys
        return m.reshape(()) if m.size == 1 else m.reshape(shape)

    def fuse_conv(self, node: onnx.NodeProto):
        ops = self.operands(node)
        found = ops and self.requant(ops[0], node.output[0])
        if not found or ops[1].value is None or ops[1].value.ndim < 3:
            return None
        (x, w), (q, ys, clip) = ops, found
        oc, rank = w.value.shape[0], w.value.ndim
        if not w.per_axis(0, oc):
            return None
        shape, bias = [1, oc] + [1] * (rank - 2), None
        if len(node.input) > 2 and node.input[2]:
            b = self.dq(node.input[2], (TensorProto.INT32,))
            if not _bias_ok(b, x.scale, w.scale, oc):
                return None
            bias = b.value.reshape(shape)
        base = node.name or "conv"
        attrs = {a: _attr(node, a) for a in _CONV_ATTRS if _attr(node, a) is not None}
        ins = [x.q, w.q, x.zp_name, self.weight_zp(w, base)]
        mult = self.multiplier(x.scale, w.scale, ys, shape)
        return self.emit(base, "ConvInteger", ins, attrs, bias, mult, "", q), [clip, q]

    def fuse_matmul(self, node: onnx.NodeProto, trans_b: bool = False, bias_name: str = ""):
        ops = self.operands(node)
        if ops is None:
            return None
        (x, w), out = ops, node.output[0]
        found = self.requant(x, out)
        if found is None and self.feeds_q(out):
            return None  # ORT fuses neither QLinearMatMul nor MatMulIntegerToFloat
        axis, n = (0 if trans_b else 1), 1
        if w.value is None:  # a runtime b: per tensor, as it is
            if not w.per_tensor or trans_b or bias_name:
                return None
        else:
            n = w.value.shape[axis] if w.value.ndim == 2 else 0
            if not n or not w.per_axis(axis, n):
                return None
        bias = None
        if bias_name:
            b = self.dq(bias_name, (TensorProto.INT32,))
            if not _bias_ok(b, x.scale, w.scale, n):
                return None
            bias = b.value.reshape(n)
        base, w_name = node.name or node.op_type.lower(), w.q
        if trans_b:
            w_name = self.add_init(f"{base}_weight_t", np.ascontiguousarray(w.value.T))
        q, ys, clip = found or (None, None, None)
        mult = self.multiplier(x.scale, w.scale, ys, [n])
        ins = [x.q, w_name, x.zp_name, self.weight_zp(w, base)]
        return self.emit(base, "MatMulInteger", ins, {}, bias, mult, out, q), [clip, q]

    def fuse_gemm(self, node: onnx.NodeProto):
        if (_attr(node, "alpha", 1.0) != 1.0 or _attr(node, "beta", 1.0) != 1.0
                or _attr(node, "transA", 0)):
            return None
        c = node.input[2] if len(node.input) > 2 else ""
        return self.fuse_matmul(node, bool(_attr(node, "transB", 0)), c)

    # --- driver ---------------------------------------------------------------------------
    def run(self, proto: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
        fusers = {"Conv": self.fuse_conv, "MatMul": self.fuse_matmul, "Gemm": self.fuse_gemm}
        emit_at: dict[int, list[onnx.NodeProto]] = {}
        gone: list[onnx.NodeProto] = []
        for node in self.graph.node:
            fuse = fusers.get(node.op_type) if node.domain in _DOMAINS else None
            if fuse is None or len(node.input) < 2 or len(node.output) != 1:
                continue
            result = fuse(node)
            if result is not None:
                nodes, extra = result
                matched = [node] + [n for n in extra if n is not None]
                emit_at[id(matched[-1])] = nodes  # at the last matched node (the Q)
                gone.extend(matched)
        if not gone:
            return proto, 0
        new = [n for ns in emit_at.values() for n in ns]
        live = self._live(gone, new)
        nodes = []
        for n in self.graph.node:
            nodes.extend(emit_at.get(id(n), []))
            if id(n) in live:
                nodes.append(n)
        return self._model(proto, nodes), len(emit_at)

    def _live(self, gone: list[onnx.NodeProto], new: list[onnx.NodeProto]) -> set[int]:
        """The original nodes kept: all but the fused ones and the DQ / Constant nodes that
        only they used."""
        live = {id(n) for n in self.graph.node} - {id(n) for n in gone}
        used: dict[str, int] = {}
        for n in [*(n for n in self.graph.node if id(n) in live), *new]:
            for i in dict.fromkeys(n.input):
                used[i] = used.get(i, 0) + 1
        work = list(gone)
        while work:
            for i in dict.fromkeys(work.pop().input):
                p = self.producer.get(i)
                if p is None or id(p) not in live or p.op_type not in (
                        "DequantizeLinear", "Constant"):
                    continue
                if any(used.get(o) or o in self.pinned for o in p.output):
                    continue
                live.discard(id(p))
                work.append(p)
                for j in dict.fromkeys(p.input):
                    used[j] -= 1
        return live

    def _model(self, proto: onnx.ModelProto, nodes: list[onnx.NodeProto]) -> onnx.ModelProto:
        """A copy of proto with `nodes`, less the initializers and value_info of the values
        only removed nodes used or made."""
        out = onnx.ModelProto()
        out.CopyFrom(proto)
        g = out.graph
        used_now = {i for n in nodes for i in n.input} | self.pinned | {v.name for v in g.input}
        used_before = {i for n in g.node for i in n.input}
        made_now = {o for n in nodes for o in n.output}
        unmade = {o for n in g.node for o in n.output} - made_now
        inits = [t for t in g.initializer if t.name in used_now or t.name not in used_before]
        infos = [v for v in g.value_info if v.name not in unmade]
        del g.node[:], g.initializer[:], g.value_info[:]
        g.node.extend(nodes)
        g.initializer.extend(inits + self.new_inits)
        g.value_info.extend(infos)
        return out


def fuse_qdq(proto: onnx.ModelProto, base_dir: str | None = None) -> tuple[onnx.ModelProto, int]:
    """Rewrite the QDQ patterns of `proto`'s main graph (see the module docstring) into
    integer ONNX ops. Returns (rewritten model, number of patterns fused); the same proto
    object and 0 when nothing applies. `proto` is not modified; `base_dir` locates
    external-data initializers, which the result keeps as they are."""
    opset = next((o.version for o in proto.opset_import if o.domain in _DOMAINS), 0)
    if not 10 <= opset <= 21:
        return proto, 0
    if not any(n.op_type == "DequantizeLinear" for n in proto.graph.node):
        return proto, 0         # (every import comes here: no graph indexes for a float model)
    return _Fuser(proto, base_dir).run(proto)
