"""Choose the activation layout: channels-last (NHWC) convolutions for f16 on CUDA and
for f32 on the CPU.

`run(graph, target, precision)`:
- target "cuda", precision "f16" (`wants_nhwc`): the tensor-core implicit-GEMM
  convolution (`schedules/cuda/conv_tc.py`) wants NHWC, where one 16-byte chunk of its
  im2col tile is 8 consecutive input channels of one input pixel (one cp.async). Each
  2-D Conv whose per-group input channels C/G are a multiple of 8 and whose weight is a
  constant becomes
      Transpose(perm 0,2,3,1) -> ConvNHWC(W as OHWI, a new constant) -> Transpose(0,3,1,2)
  with the pads resolved (auto_pad folded into explicit pads); so does every depthwise
  conv (C/G = OC/G = 1) on a multiple of 8 channels, which the channel-vector kernel
  of `schedules/cuda/depthwise_nhwc.py` runs with 16-byte loads and stores (MobileNet's
  blocks then stay NHWC from pointwise conv to pointwise conv). Other convs stay NCHW:
  for C/G % 8 != 0 the chunk would straddle input pixels, the gather degrades to 8-,
  4-byte or scalar copies and the GEMM is too narrow to feed the tensor cores (the RGB
  stem C = 3); the SIMT NCHW kernels serve them better and the layout shuffle would
  cost two transposes for nothing. Convs with a non-constant weight also stay (their
  weight cannot be re-laid-out at compile time).
- target "cpu", precision "f32" (`wants_nhwc_cpu`): the channels-last direct
  convolution runs its K along contiguous channels (one pointer per output position,
  the weights in NR-channel panels, the output stored along contiguous channels), which
  beat the NCHW implicit GEMM / direct kernels inside ResNet-50 (1.06x against 1.17x of
  ONNX Runtime, paired rounds). Every Conv with one group or C/G >= 8, and every
  depthwise conv (C/G = OC/G = 1) on at least 8 channels, becomes ConvNHWC (the RGB
  stem too: its kernel rows are runs of KW*3 contiguous values); grouped convs with
  2-7 channels per group stay NCHW.
- any other target or precision: the graph is returned unchanged (the f32 SIMT CUDA
  templates are written for NCHW).

Then, on both targets, the transposes are sunk and cancelled, in one topological walk
tracking which NCHW values are `Transpose(u, 0,3,1,2)` of an NHWC value u (not yet
materialized):
  * Transpose(v, 0,2,3,1) of such a v is u itself (the pair cancels);
  * a layout-agnostic elementwise op on such a v (the unary ops, Relu, Clip, Cast, and
    Add/Sub/Mul/Div/PRelu when the other operand is such a value too, a value that
    already has its NHWC transpose (a graph input the first convolution reads, added
    back as a residual), or a constant broadcastable to v's shape, re-laid-out as a new
    constant, and the output has v's shape) is applied to u instead, its output
    tracked the same way;
  * Concat along the channels (axis 3 of the NHWC values), float MaxPool / AveragePool
    (MaxPoolNHWC / AveragePoolNHWC, both targets have kernels) and the global pools
    (ReduceMean / ReduceMax over axes 1, 2, keepdims) of such values are applied to
    the NHWC values too (`_Sinker.sink_pool_or_concat`), so Inception's blocks stay
    NHWC from concat to concat;
  * a second Transpose(v, 0,2,3,1) of the same value reuses the first;
  * anything else (Reshape, Flatten, a graph output ...) gets the NCHW value
    materialized by one Transpose right before its first use.
So a ResNet block (conv-relu-conv-add-relu with a 1x1 projection) stays NHWC from
convolution to convolution, and a transpose remains only at layout-specific ops.

Assumes: nodes in topological order; the verifier's invariants hold. Guarantees: the
graph computes the same outputs (the same numpy reference results; the pass never
looks at dtypes), graph input/output names and types are kept, the verifier passes,
and the old OIHW weights are dropped when unused. Returns the same graph object when
nothing applies.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hidetc.graph.ir import Graph, Node
from hidetc.graph.ops.conv import window_geometry
from hidetc.graph.ops.elementwise import UNARY
from hidetc.graph.ops.layout import TO_NCHW, TO_NHWC
from hidetc.graph.passes import eliminate_dead_code
from hidetc.graph.passes.common import Rewriter, node_base, resolve

CHANNEL_CHUNK = 8   # halves per 16-byte cp.async chunk (cuda); floats per ymm (cpu)
UNARY_OPS = frozenset(UNARY) | {"Clip", "Cast"}   # input 0 only; others are scalars
BINARY_OPS = frozenset({"Add", "Sub", "Mul", "Div", "PRelu"})
FLOATS = frozenset({"float32", "float16", "bfloat16", "float64"})
GLOBAL_POOLS = {"GlobalAveragePool": "ReduceMean", "GlobalMaxPool": "ReduceMax"}
LAYOUT_SINKS = frozenset({"Concat", "MaxPool", "AveragePool", *GLOBAL_POOLS})


def run(graph: Graph, policy: "Policy") -> Graph:
    """The convolutions `policy` picks go NHWC, transposes sunk (module docstring)."""
    rewritten = rewrite_convs(graph, policy)
    if rewritten is graph:
        return graph
    return eliminate_dead_code.run(sink_transposes(rewritten))


# ------------------------------------------------------------------ Conv -> ConvNHWC

# the convolutions the pass rewrites and their channels-last twins (the integer one's
# zero points, inputs 2 and 3, pass through unchanged: a scalar and a per-OC vector)
NHWC_OF = {"Conv": "ConvNHWC", "ConvInteger": "ConvIntegerNHWC"}


def _conv_channels(graph: Graph, node: Node) -> int | None:
    """C/G of a 2-D Conv with a constant weight, else None."""
    if node.op not in NHWC_OF or graph.types[node.inputs[0]].rank != 4:
        return None
    if node.inputs[1] not in graph.constants:
        return None
    return graph.types[node.inputs[0]].shape[1] // node.attr("group", 1)


def _depthwise(graph: Graph, node: Node, icg: int) -> bool:
    """One input and one output channel per group (no channel multiplier)."""
    group = node.attr("group", 1)
    return icg == 1 and group > 1 and graph.types[node.inputs[1]].shape[0] == group


def wants_nhwc(graph: Graph, node: Node) -> bool:
    """cuda f16 and bf16: C/G a positive multiple of 8 (one 16-byte chunk per pixel), or a
    depthwise conv on a multiple of 8 channels (16-byte channel vectors)."""
    icg = _conv_channels(graph, node)
    if icg is None or icg == 0:
        return False
    channels = graph.types[node.inputs[0]].shape[1]
    return icg % CHANNEL_CHUNK == 0 or (_depthwise(graph, node, icg)
                                        and channels % CHANNEL_CHUNK == 0)


def wants_nhwc_cpu(graph: Graph, node: Node) -> bool:
    """cpu f32: one group (the direct kernel's K runs along a kernel row's KW*C
    contiguous values: even the RGB stem's 21), C/G of at least 8 (grouped: a run per
    tap of C/G channels), or a depthwise conv without channel multiplier on at least 8
    channels (vectorized along the channels)."""
    icg = _conv_channels(graph, node)
    if icg is None or icg == 0:
        return False
    channels, group = graph.types[node.inputs[0]].shape[1], node.attr("group", 1)
    depthwise = _depthwise(graph, node, icg) and channels >= CHANNEL_CHUNK
    return group == 1 or icg >= CHANNEL_CHUNK or depthwise


Policy = Callable[[Graph, Node], bool]     # which convs go NHWC (a backend picks one)


def rewrite_convs(graph: Graph, policy: Policy = wants_nhwc) -> Graph:
    rw = Rewriter(graph)
    for node in graph.nodes:
        if policy(graph, node):
            to_nhwc(rw, node)
        else:
            rw.emit(node)
    return rw.finish()


def to_nhwc(rw: Rewriter, node: Node) -> None:
    base = node_base(node)
    x, w = node.inputs[0], node.inputs[1]
    weight = rw.constants[w]
    attrs = node.attr_dict
    win = window_geometry("Conv", rw.types[x].shape[2:], weight.shape[2:], attrs)
    ohwi = rw.const(f"{w}_ohwi", np.transpose(weight, TO_NHWC))
    xt = rw.add("Transpose", (x,), f"{base}_in_nhwc", perm=TO_NHWC)
    y = rw.add(NHWC_OF[node.op], (xt, ohwi) + tuple(node.inputs[2:]), f"{base}_nhwc",
               strides=win.strides, dilations=win.dilations, pads=win.begin + win.end,
               group=attrs.get("group", 1))
    rw.add("Transpose", (y,), f"{base}_out_nchw", out=node.outputs[0], perm=TO_NCHW)


# ------------------------------------------------------------------ sinking

def is_perm(node: Node, perm: tuple[int, ...]) -> bool:
    return node.op == "Transpose" and tuple(node.attr("perm") or ()) == perm


class _Sinker:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.rw = Rewriter(graph)
        self.nhwc: dict[str, str] = {}     # NCHW value -> NHWC value it transposes (lazy)
        self.subst: dict[str, str] = {}    # renamed values (cancelled pairs)
        self.done: set[str] = set()        # lazily transposed values materialized
        self.to_nhwc: dict[str, str] = {}  # NCHW value -> its emitted NHWC transpose

    def materialize(self, value: str) -> None:
        if value in self.nhwc and value not in self.done:
            self.done.add(value)
            self.rw.add("Transpose", (self.nhwc[value],), f"{value}_nchw", out=value,
                        perm=TO_NCHW)

    def other_operand(self, value: str, shape: tuple[int, ...]) -> str | None:
        """`value` as an NHWC operand for an op whose NCHW output has `shape`."""
        if value in self.nhwc and self.rw.types[value].shape == shape:
            return self.nhwc[value]
        if value in self.to_nhwc and self.rw.types[value].shape == shape:
            return self.to_nhwc[value]      # already transposed for another consumer
        array = self.rw.constants.get(value)
        if array is None or array.ndim > 4:
            return None
        if array.size == 1:
            return value
        full = array.reshape((1,) * (4 - array.ndim) + array.shape)
        return self.rw.const(f"{value}_nhwc", np.transpose(full, TO_NHWC))

    def sink(self, node: Node) -> bool:
        """Apply `node` to NHWC values instead; False when it is not layout-agnostic."""
        ins = node.inputs
        if len(node.outputs) != 1:
            return False
        if node.op in LAYOUT_SINKS:
            return self.sink_pool_or_concat(node)
        if not any(v in self.nhwc for v in ins if v):
            return False
        if node.op in UNARY_OPS and ins[0] in self.nhwc:
            if any(v in self.nhwc for v in ins[1:] if v):
                return False
            new_inputs = (self.nhwc[ins[0]],) + ins[1:]
        elif node.op in BINARY_OPS and len(ins) == 2:
            shape = self.rw.types[node.outputs[0]].shape
            operands = [self.other_operand(v, shape) for v in ins]
            if None in operands:
                return False
            new_inputs = tuple(operands)
        else:
            return False
        out = node.outputs[0]
        self.nhwc[out] = self.rw.add(node.op, new_inputs, f"{out}_nhwc", **node.attr_dict)
        return True

    def sink_pool_or_concat(self, node: Node) -> bool:
        """The NHWC twins of layout-specific ops: a channel Concat of NHWC values is a Concat on
        axis 3; a 2-D float MaxPool / AveragePool its NHWC twin (single-output: a
        MaxPool with Indices has two and stays); a global pool a ReduceMean/ReduceMax
        over axes 1 and 2. An input counts as NHWC when it is tracked or already has
        its NHWC transpose (a graph input the convolutions read too)."""
        ins, out = node.inputs, node.outputs[0]
        nhwc = [self.nhwc.get(v) or self.to_nhwc.get(v) if v else None for v in ins]
        if node.op == "Concat" and node.attr("axis") in (1, -3) and all(nhwc):
            self.nhwc[out] = self.rw.add("Concat", tuple(nhwc), f"{out}_nhwc", axis=3)
            return True
        if not nhwc or nhwc[0] is None or self.rw.types[ins[0]].rank != 4:
            return False
        if node.op in ("MaxPool", "AveragePool") and self.rw.types[ins[0]].dtype in FLOATS:
            self.nhwc[out] = self.rw.add(f"{node.op}NHWC", (nhwc[0],), f"{out}_nhwc",
                                         **node.attr_dict)
            return True
        if node.op in GLOBAL_POOLS:
            axes = self.rw.const(f"{out}_axes", np.array([1, 2], np.int64))
            self.nhwc[out] = self.rw.add(GLOBAL_POOLS[node.op], (nhwc[0], axes),
                                         f"{out}_nhwc", keepdims=1)
            return True
        return False

    def visit(self, node: Node) -> None:
        node = node.with_(inputs=tuple(resolve(self.subst, v) if v else v
                                       for v in node.inputs))
        x = node.inputs[0] if node.inputs else ""
        renamable = bool(node.outputs) and node.outputs[0] not in self.graph.outputs
        if is_perm(node, TO_NCHW) and self.rw.types[x].rank == 4:
            self.nhwc[node.outputs[0]] = x          # emitted only if needed in NCHW
            self.rw.changed = True
        elif is_perm(node, TO_NHWC) and renamable and x in self.nhwc:
            self.subst[node.outputs[0]] = self.nhwc[x]     # the pair cancels
            self.rw.changed = True
        elif is_perm(node, TO_NHWC) and renamable and x in self.to_nhwc:
            self.subst[node.outputs[0]] = self.to_nhwc[x]  # one transpose per value
            self.rw.changed = True
        elif not self.sink(node):
            for value in node.inputs:
                self.materialize(value)
            self.rw.emit(node)
            if is_perm(node, TO_NHWC):
                self.to_nhwc[x] = node.outputs[0]

    def finish(self) -> Graph:
        for node in self.graph.nodes:
            self.visit(node)
        for value in self.graph.outputs:   # never renamed: cancelling skips outputs
            self.materialize(value)
        return self.rw.finish()


def sink_transposes(graph: Graph) -> Graph:
    return _Sinker(graph).finish()
