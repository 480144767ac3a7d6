"""A `Task` is one operator instance with everything a kernel builder needs: the op, its
concrete input/output types, attributes, and the compile-time values of its parameter
inputs (Reshape's shape, Slice's starts, ...). Tasks are hashable: equal tasks share one
kernel (and, later, one tuning result).

A `Kernel` is a built `Function` plus which task inputs its buffer parameters take, in
order; the output buffers follow the inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from hidetc.errors import UnsupportedOpError
from hidetc.graph.guards import current_hint
from hidetc.graph.ir import Graph, Node, TensorType, freeze_attr
from hidetc.graph.ops.registry import get_op
from hidetc.graph.symbolic import Dim, SymDim, as_dim, evaluate
from hidetc.tir.ir import Function


@dataclass(frozen=True)
class Task:
    op: str
    inputs: tuple[TensorType | None, ...]
    outputs: tuple[TensorType, ...]
    attrs: tuple[tuple[str, Any], ...]
    params: tuple[Any, ...]   # per input: a frozen value for parameter inputs, else None

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)

    def param(self, index: int, default: Any = None) -> Any:
        if index >= len(self.params) or self.params[index] is None:
            return default
        return self.params[index]

    @property
    def buffer_inputs(self) -> tuple[int, ...]:
        """Indices of the inputs passed to the kernel as buffers."""
        return tuple(i for i, (t, p) in enumerate(zip(self.inputs, self.params))
                     if t is not None and p is None)

    @property
    def symbolic(self) -> bool:
        return any(t is not None and t.symbolic for t in (*self.inputs, *self.outputs))

    def at(self, sizes: Mapping[str, int]) -> "Task":
        """The static task with the symbolic sizes at `sizes` (types and parameters)."""
        if not self.symbolic:
            return self
        return Task(self.op, tuple(None if t is None else t.at(sizes) for t in self.inputs),
                    tuple(t.at(sizes) for t in self.outputs), self.attrs,
                    tuple(_param_at(p, sizes) for p in self.params))

    def hinted(self) -> "Task":
        """The task a heuristic plans with: itself when static, else at the enclosing
        build's hint sizes (`guards.guarded`); the kernel keeps the symbolic sizes."""
        if not self.symbolic:
            return self
        hint = current_hint()
        if hint is None:
            raise UnsupportedOpError(f"{self.op}: a task with symbolic sizes is planned "
                                     f"only inside a guarded build")
        return self.at(hint)

    def signature(self) -> str:
        ins = ", ".join(str(t) if t is not None else "-" for t in self.inputs)
        outs = ", ".join(map(str, self.outputs))
        return f"{self.op}({ins}) -> {outs}"


def _param_at(value: Any, sizes: Mapping[str, int]) -> Any:
    if isinstance(value, tuple):
        return tuple(_param_at(v, sizes) for v in value)
    return evaluate(value, sizes) if isinstance(value, SymDim) else value


@dataclass(frozen=True)
class Kernel:
    function: Function
    task: Task

    @property
    def name(self) -> str:
        return self.function.name


def task_of(node: Node, graph: Graph) -> Task:
    """The task of `node`: parameter inputs (the op's value_inputs) must be constants."""
    opdef = get_op(node.op)
    types, params = [], []
    for i, value in enumerate(node.inputs):
        types.append(graph.types[value] if value else None)
        if value and i in opdef.value_inputs:
            array = graph.constants.get(value)
            if array is None:
                raise UnsupportedOpError(f"node {node.name!r} ({node.op}): input {i} must be "
                                         f"a constant known at compile time (dynamic shapes "
                                         f"are not supported)")
            params.append(freeze_attr(np.asarray(array)))
        else:
            params.append(None)
    outs = tuple(graph.types[o] for o in node.outputs if o)
    return Task(node.op, tuple(types), outs, node.attrs, tuple(params))


REDUCING = ("Softmax", "LogSoftmax", "LayerNormalization", "GlobalAveragePool",
            "GlobalMaxPool")


def task_flops(task: Task) -> Dim:
    """Floating-point operations of one run of `task`'s anchor op, a multiply-add
    counted as 2 (the fused neighbours are not counted): MatMul 2 M N K per batch entry,
    FusedAttention its two products,
    Conv/ConvNHWC 2 x output elements x the weights per output channel; pools one per
    window element of each output; reductions one per input element; other ops one per
    output element. Symbolic sizes give a symbolic count."""
    out = sum(t.size for t in task.outputs if t is not None)
    if task.op in ("MatMul", "MatMulInteger"):
        return 2 * out * as_dim(task.inputs[0].shape[-1])
    if task.op == "FusedAttention":         # Q Kt and P V: 2 Sq Sk (D + Dv) per entry
        q, kt, v = task.inputs[0], task.inputs[1], task.inputs[2]
        entries = out // max(1, q.shape[-2] * v.shape[-1])
        return 2 * entries * q.shape[-2] * kt.shape[-1] * (q.shape[-1] + v.shape[-1])
    if task.op in ("Conv", "ConvNHWC", "ConvInteger", "ConvIntegerNHWC"):
        return 2 * out * math.prod(task.inputs[1].shape[1:])
    if task.op.startswith(("MaxPool", "AveragePool")):
        return out * math.prod(task.attr("kernel_shape") or (1,))
    if task.op in REDUCING or task.op.startswith("Reduce"):
        return task.inputs[0].size
    return out
