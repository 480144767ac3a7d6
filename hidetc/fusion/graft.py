"""Graft a fusion group's prologues and epilogues onto its anchor's kernel.

The anchor's kernel was built from the anchor's task alone (any template, any config);
its buffer parameters are the task's buffer inputs in order, then its outputs, then
any scratch buffers (`hidetc.tir.scratch`: passed through, still last, bound to
placeholder values the plan replaces with memory). Grafting
rewrites that Function (before lowering):

- **prologue**: every read of an input produced inside the group, `Load(B, i)`, becomes
  the producer's compute expression at that index (`hidetc.compute.injective.COMPUTE`;
  float16 and bfloat16 operands widened to float32 and each member's result rounded to
  its own dtype, exactly what the unfused cuda kernels store),
  recursively through prologue chains, reading the producers' own inputs from new
  buffer parameters. Copies that take the buffer's address (`hidetc_copy{4,8,16}`,
  `hidetc_ld_f4`, `hidetc_cp_async{4,8,16}` of the tensor-core pipeline) are expanded
  into element-wise loads and stores: the prologue is computed on the cheap path and
  written to the same shared/local destination (cp.async's zero fill becomes an explicit
  predicated store of zeros), so the pipeline's waits and barriers still order it.
  AVX2 / AVX-512 loads from memory (`_mm256_broadcast_ss`, `_mm256_loadu_ps`,
  `_mm512_loadu_ps`) become the same vector built from the computed values
  (`_mm256_set1_ps`, `_mm256_setr_ps`, `_mm512_setr_ps`).
- **epilogue**: every store to the anchor's output, `Store(O, i, v)`, becomes: declare v,
  evaluate the epilogue members in order at the element's index (elementwise members
  keep the index; Reshape and Transpose map it), reading their other inputs from new
  buffer parameters, and store the final value to the group's output at the final
  index. Vector stores (`hidetc_copy*` from registers to O) are expanded per element.
- **into a Concat** (`FusionGroup.into`): the group's result goes to its slice of the
  Concat's output instead (the buffer parameter becomes the Concat's output): the
  index on the concat axis moves by the slice offset. Along the last axis the kernel's
  own view index is kept when it only merges leading dims (a channels-last conv's
  [N*OH*OW, C] rows are rows of the [N*OH*OW, C_total] output: no div/mod); a slice
  that is contiguous (every dim before the axis is 1: NCHW batch 1) is one linear
  offset; otherwise the logical index is shifted.

A kernel view of a tensor may differ from its logical shape (a 1-D MatMul operand
viewed as 1 x K, Softmax's (outer, n, inner) view): indices go through the row-major
linear offset whenever the shapes differ.

In place: an epilogue input of the output's shape read through the view index (a
residual Add's other operand) gets a buffer parameter of its own that is read only
right before the store of the same element (same index, same view), when the chain has
no Transpose and no Concat slice. Such values are `FusedKernel.in_place`: the planner
may give the output their memory (each element is read, then overwritten by the one
store of that element), and the function's `may_alias` attr names both parameters so
the C printer does not declare them `restrict`.

Refuses (GraftError, and the planner keeps the group unfused) when the kernel reads its
own output back, or passes a grafted buffer's address to a call other than a vector copy
(`tir.intrinsics`: the records' address operands; value operands are grafted). Guarantees: every
element the anchor stored is stored exactly once to the group's output, with the value
the unfused kernels would have produced (same expressions, same order of operations).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from hidetc.compute.injective import COMPUTE, linearize, regroup, reshape_groups, unravel
from hidetc.compute.task import task_of
from hidetc.fusion.partition import FusionGroup
from hidetc.graph.ir import Graph, Node
from hidetc.graph.symbolic import SymDim
from hidetc.tir import intrinsics, scratch
from hidetc.tir.functor import Rewriter, all_names
from hidetc.tir.ir import (
    Buffer,
    Call,
    Const,
    Declare,
    Evaluate,
    Expr,
    Function,
    If,
    Load,
    Stmt,
    Store,
    Var,
    as_expr,
    cast,
    seq,
    size_dim,
)


def widen(value: Expr) -> Expr:
    """A float16 or bfloat16 value in float32 for arithmetic (the unfused cuda kernels'
    rule: compute in float32, round once per op at its store -- here, at each member's
    result)."""
    return cast(value, "float32") if value.dtype in ("float16", "bfloat16") else value


class GraftError(ValueError):
    """This kernel cannot take this group's prologues/epilogues."""


@dataclass(frozen=True)
class FusedKernel:
    function: Function
    args: tuple[str, ...]     # the graph value bound to each buffer parameter, in order
    in_place: tuple[str, ...] = ()   # values the output may share memory with (`graft`)


def _shape(graph: Graph, value: str) -> tuple[int, ...]:
    return tuple(graph.types[value].shape)


REGROUPING = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def _regroups_symbolic(graph: Graph, node) -> bool:
    """Whether a reshape merges or splits a dimension of symbolic size with another (a
    group of `reshape_groups` holding a symbolic dim and more than one dim not 1 on a
    side): computed inside a prologue, its div/mod chains over run-time extents nest
    without simplifying (each level repeats the one below), so such a node is not fused
    -- it runs as its own kernel, and the kernels reading it see a materialized value (a
    view). Splitting heads off a hidden dim beside a symbolic sequence is fused."""
    shapes = [_shape(graph, node.inputs[0]), _shape(graph, node.outputs[0])]
    if not any(isinstance(d, SymDim) for shape in shapes for d in shape):
        return False
    for group in reshape_groups(*shapes):
        dims = [[shape[d] for d in part] for shape, part in zip(shapes, group)]
        if any(isinstance(d, SymDim) for part in dims for d in part) and \
                any(sum(1 for d in part if not (isinstance(d, int) and d == 1)) > 1
                    for part in dims):
            return True
    return False


def to_logical(idx: Sequence[Expr], view: Sequence[int], shape: Sequence[int]) -> list[Expr]:
    """The index into `shape` of element `idx` of the row-major view `view`."""
    if tuple(view) == tuple(shape):
        return list(idx)
    if not shape:
        return []
    return regroup(idx, view, shape)


def offset(idx: Sequence[Expr], shape: Sequence, e: int, width: int) -> list[Expr]:
    """Element `e` after `idx` in a row-major buffer, for a copy of `width` elements
    that starts aligned to `width` (so it stays in one row when rows are multiples)."""
    if e == 0:
        return list(idx)
    last = shape[-1] if shape else 1
    if isinstance(last, int) and last % width == 0:
        return list(idx[:-1]) + [idx[-1] + e]
    return unravel(linearize(list(idx), list(shape)) + e, list(shape))


def forward_index(node: Node, graph: Graph, idx: list[Expr]) -> list[Expr]:
    """Index of the output element of an index-map node that reads input element `idx`."""
    if node.op == "Transpose":
        rank = len(idx)
        perm = node.attr("perm") or tuple(range(rank))[::-1]
        return [idx[p] for p in perm]
    return to_logical(idx, _shape(graph, node.inputs[0]), _shape(graph, node.outputs[0]))


class _Graft(Rewriter):
    def __init__(self, fn: Function, anchor: Node, group: FusionGroup, graph: Graph):
        self.graph = graph
        self.names = all_names(fn)
        self.members = {n.name: n for n in graph.nodes if n.name in group.members}
        self.producer = {o: n for n in self.members.values() for o in n.outputs if o}
        task = task_of(anchor, graph)
        n_in = len(task.buffer_inputs)
        params = scratch.task_params(fn)
        self.scratch = scratch.scratch_params(fn)      # passed through, last
        buffers = [p for p in params if isinstance(p, Buffer)]
        values = [anchor.inputs[i] for i in task.buffer_inputs] + \
            [o for o in anchor.outputs if o]
        if len(buffers) != len(values) or len(buffers) != len(params):
            raise GraftError(f"{fn.name}: parameters do not match the task's buffers")
        self.value_of = dict(zip(buffers, values))
        self.prologue_nodes = set(group.prologues)
        self.inputs = list(zip(buffers[:n_in], values[:n_in]))
        self.outputs = list(zip(buffers[n_in:], values[n_in:]))
        self.prologue = {b: v for b, v in self.inputs
                         if v in self.producer and self.producer[v].name in self.prologue_nodes}
        self.epilogue = list(group.epilogues)
        self.out_buffer = buffers[n_in] if self.epilogue or group.into else None
        self.external: dict[tuple, Buffer] = {}
        self.in_place: dict[Buffer, str] = {}    # same-index epilogue reads -> value
        # the final store keeps the kernel's view index (no Transpose, no Concat slice)
        self.same_index = not group.into and not any(
            self.members[e].op == "Transpose" for e in self.epilogue)
        self.final: Buffer | None = None
        self.slice: tuple[int, int, tuple[int, ...]] | None = None   # axis, offset, shape
        if self.out_buffer is not None:
            self.result = self.members[group.output_node].outputs[0]
            self.final_value = self.result
            if group.into:
                concat = next(n for n in graph.nodes if n.name == group.into)
                self.final_value = concat.outputs[0]
                rank = len(_shape(graph, self.final_value))
                axis = concat.attr("axis") % rank
                k = concat.inputs.index(self.result)
                start = sum(_shape(graph, v)[axis] for v in concat.inputs[:k])
                self.slice = (axis, start, _shape(graph, self.final_value))
            t = graph.types[self.final_value]
            self.final = Buffer(self._fresh("out"), t.dtype, tuple(t.shape))
        self.tasks = {name: task_of(node, graph) for name, node in self.members.items()}

    def _fresh(self, hint: str) -> str:
        name, k = hint, 0
        while name in self.names:
            k += 1
            name = f"{hint}_{k}"
        self.names.add(name)
        return name

    def _input(self, value: str, view: tuple | None = None, same: bool = False) -> Buffer:
        """The new buffer parameter reading graph value `value` (indexed by its own
        shape, or by `view`: the anchor output's view, for values of that shape).
        `same`: a parameter of its own, read only where the group's output element of
        the same index is stored (an in-place candidate, `in_place`)."""
        key = (value, view, same)
        buf = self.external.get(key)
        if buf is None:
            t = self.graph.types[value]
            buf = Buffer(self._fresh("in"), t.dtype, tuple(t.shape if view is None else view))
            self.external[key] = buf
            if same:
                self.in_place[buf] = value
        return buf

    # prologues ------------------------------------------------------------------------
    def value_at(self, value: str, idx: list[Expr]) -> Expr:
        """The element `idx` of `value`: computed when a prologue produces it."""
        node = self.producer.get(value)
        if node is None or node.name not in self.prologue_nodes:
            return Load(self._input(value), tuple(as_expr(i) for i in idx))
        source = node.inputs[0] if node.op == "Reshape" else None
        if source is not None and (self.producer.get(source) is None or
                                   self.producer[source].name not in self.prologue_nodes):
            # a Reshape of a materialized value is a view of its memory: read it
            # through a buffer of the reshaped shape (no div/mod per element)
            return Load(self._input(source, _shape(self.graph, value)),
                        tuple(as_expr(i) for i in idx))
        if node.op in REGROUPING and _regroups_symbolic(self.graph, node):
            raise GraftError(f"{node.name} ({node.op}) regroups symbolic sizes inside a "
                             f"prologue (its index arithmetic would not simplify)")
        task = self.tasks[node.name]
        load: Callable = lambda i, index: widen(  # noqa: E731
            self.value_at(node.inputs[i], list(index)))
        return cast(COMPUTE[node.op](task, list(idx), load), task.outputs[0].dtype)

    def visit_Load(self, e: Load) -> Expr:
        if e.buffer is self.out_buffer:
            raise GraftError("the kernel reads its output back: epilogues cannot be grafted")
        idx = self.exprs(e.indices)
        value = self.prologue.get(e.buffer)
        if value is None:
            return e if idx is e.indices else Load(e.buffer, idx)
        shape = _shape(self.graph, value)
        return self.value_at(value, to_logical(idx, e.buffer.shape, shape))

    def visit_Call(self, e: Call) -> Expr:
        record = intrinsics.lookup(e.func)
        value_form = record.value_form if record is not None else None
        if value_form and isinstance(e.args[0], Load) and e.args[0].buffer in self.prologue:
            func, width = value_form
            src = e.args[0]
            idx = self.exprs(src.indices)
            lanes = [self.visit_Load(Load(src.buffer, tuple(offset(idx, src.buffer.shape, k,
                                                                   width))))
                     for k in range(width)]
            return Call(func, tuple(lanes), e.dtype)
        addresses = intrinsics.address_args(e.func)   # the other operands are values
        for i, arg in enumerate(e.args):
            if i in addresses and isinstance(arg, Load) and (arg.buffer in self.prologue or
                                          arg.buffer is self.out_buffer):
                raise GraftError(f"{e.func} takes the address of a fused buffer")
        return super().visit_Call(e)

    # epilogues ------------------------------------------------------------------------
    def epilogue_store(self, idx: Sequence[Expr], value: Expr) -> Stmt:
        """Declare the stored value, run the epilogue members on it, store the result.
        Values whose elements lie in the anchor output's memory order are read and
        written through the kernel's own view index (`view`) while only Reshapes
        intervened (a Reshape relabels the same row-major memory), so a view that merges
        dims (a conv's [N, C, OH*OW]) or a Reshape between the anchor and a residual Add
        costs no div/mod per element; a Transpose ends that."""
        out_value = self.value_of[self.out_buffer]
        out_shape = _shape(self.graph, out_value)
        view_shape = tuple(size_dim(d) for d in self.out_buffer.shape)  # Exprs -> SymDims
        stmts: list[Stmt] = []
        first = Var(self._fresh("v"), value.dtype)
        stmts.append(Declare(first, value))
        view: list[Expr] | None = list(idx)
        current = out_shape                 # logical shape of the running value
        env: dict[str, tuple[Expr, list[Expr]]] = {
            out_value: (first, to_logical(idx, view_shape, out_shape))}

        def read(value_name: str, index) -> Expr:
            shape = _shape(self.graph, value_name)
            if view is not None and shape == current:
                return Load(self._input(value_name, None if shape == view_shape
                                        else view_shape, self.same_index), tuple(view))
            return Load(self._input(value_name), tuple(as_expr(j) for j in index))

        for name in self.epilogue:
            node = self.members[name]
            fused = next(v for v in node.inputs if v in env)
            expr, at = env[fused]
            if node.op in ("Reshape", "Transpose"):
                env[node.outputs[0]] = (expr, forward_index(node, self.graph, at))
                current = _shape(self.graph, node.outputs[0])
                if node.op == "Transpose":
                    view = None
                continue
            load = lambda i, index, node=node: widen(  # noqa: E731
                env[node.inputs[i]][0] if node.inputs[i] in env else read(node.inputs[i], index))
            task = self.tasks[name]
            result = cast(COMPUTE[node.op](task, list(at), load), task.outputs[0].dtype)
            var = Var(self._fresh("v"), result.dtype)
            stmts.append(Declare(var, result))
            env[node.outputs[0]] = (var, at)
        expr, at = env[self.result]
        target, shape = at, _shape(self.graph, self.final_value)
        if view is not None:
            target, shape = view, view_shape
        if self.slice is not None:
            target, shape = self.into_slice(at, view, view_shape)
        if shape != self.final.shape:
            self.final = Buffer(self.final.name, self.final.dtype, shape)
        stmts.append(Store(self.final, tuple(as_expr(i) for i in target),
                           cast(expr, self.final.dtype)))
        return seq(*stmts)

    def into_slice(self, at: list[Expr], view: list[Expr] | None, view_shape: tuple
                   ) -> tuple[list[Expr], tuple[int, ...]]:
        """(index, buffer shape) of the Concat output element for result element `at`
        (logical), or `view` (the kernel's own view index, when still valid)."""
        axis, start, full = self.slice
        part = _shape(self.graph, self.result)
        if axis == len(full) - 1 and view is not None and view_shape[-1] == part[-1]:
            return view[:-1] + [view[-1] + start], tuple(view_shape[:-1]) + (full[-1],)
        if int(np.prod(full[:axis])) == 1:
            inner = int(np.prod(full[axis + 1:]))
            flat = linearize(view, view_shape) if view is not None else linearize(at, part)
            return [flat + start * inner], (int(np.prod(full)),)
        return [a + start if d == axis else a for d, a in enumerate(at)], full

    def visit_Store(self, s: Store) -> Stmt:
        if s.buffer is not self.out_buffer:
            return super().visit_Store(s)
        return self.epilogue_store(self.exprs(s.indices), self.expr(s.value))

    def visit_Evaluate(self, s: Evaluate) -> Stmt:
        call = s.expr
        if not isinstance(call, Call) or len(call.args) < 2 or \
                not all(isinstance(a, Load) for a in call.args[:2]):
            return super().visit_Evaluate(s)
        dst, src = call.args[0], call.args[1]
        grafted_src = src.buffer in self.prologue
        grafted_dst = dst.buffer is self.out_buffer
        if not (grafted_src or grafted_dst):
            return super().visit_Evaluate(s)
        record = intrinsics.lookup(call.func)
        nbytes = record.copy_bytes if record is not None else 0
        if not nbytes:
            raise GraftError(f"{call.func} takes the address of a fused buffer")
        width = nbytes // np.dtype(src.buffer.dtype).itemsize
        dst_idx, src_idx = self.exprs(dst.indices), self.exprs(src.indices)
        stores, zeros = [], []
        for e in range(width):
            d = offset(dst_idx, dst.buffer.shape, e, width)
            if grafted_src:
                element = self.visit_Load(Load(src.buffer, tuple(
                    offset(src_idx, src.buffer.shape, e, width))))
            else:
                element = Load(src.buffer, tuple(offset(src_idx, src.buffer.shape, e, width)))
            if grafted_dst:
                stores.append(self.epilogue_store(d, element))
            else:
                stores.append(Store(dst.buffer, tuple(d), element))
                zeros.append(Store(dst.buffer, tuple(d), Const(0, dst.buffer.dtype)))
        if record.asynchronous:
            return If(self.expr(call.args[2]), seq(*stores), seq(*zeros))
        return seq(*stores)


def graft(fn: Function, anchor: Node, group: FusionGroup, graph: Graph) -> FusedKernel:
    """`fn` (the anchor's kernel) with `group`'s prologues and epilogues grafted on."""
    g = _Graft(fn, anchor, group, graph)
    body = g.stmt(fn.body)
    ordered = [(b, v) for b, v in g.inputs if b not in g.prologue]
    ordered += [(b, v) for (v, _, _), b in g.external.items()]
    ordered += [(g.final, g.final_value)] if g.final is not None else g.outputs
    ordered += [(b, scratch.placeholder(b, kind)) for b, kind in g.scratch]
    shared = [b for b, _ in ordered if b in g.in_place]
    attrs = fn.attrs
    if shared:   # the C printer drops `restrict` from these: they may be one buffer
        attrs += (("may_alias", tuple(b.name for b in (*shared, g.final))),)
    function = Function(fn.name, tuple(b for b, _ in ordered), body, attrs)
    return FusedKernel(function, tuple(v for _, v in ordered),
                       tuple(g.in_place[b] for b in shared))
