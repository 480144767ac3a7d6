"""Einsum read as a decomposition into Transpose, Reshape, Gather, Expand, ReduceSum and
MatMul.

Assumes: static shapes, all operands of one dtype. Schema history (reviewed up to opset
28): Einsum-12 and -28 differ only in their type list (bfloat16 added), so both are
read the same way.
Guarantees (numpy's einsum semantics, which the ONNX spec follows):
  - the equation may hold spaces; labels are ASCII letters; "..." (at most once per
    term) stands for the leading/middle dims not labelled, right-aligned across
    operands and broadcast like numpy; explicit output ("->"), or implicit: the
    ellipsis dims, then the letters used exactly once, in character-code order (upper
    case before lower case);
  - a label repeated within one operand ("ii->i") takes the diagonal: its axes moved
    last, merged by a Reshape, and a Gather of the diagonal positions;
  - a label no later operand and not the output uses is summed out (ReduceSum) as soon
    as possible; operands are contracted left to right, each pair by one MatMul over
    [batch.., M, K] x [batch.., K, N] (Transpose/Reshape around it only where the
    layout needs them); a size-1 dim against a larger one is Expanded first;
  - bfloat16 operands are computed in float32 and cast back (as the ONNX reference);
  - a problem with the equation or the shapes is a one-line ModelError.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, label
from hidetc.graph.symbolic import shape_array

ELLIPSIS = "..."
WIDE = {"bfloat16": "float32"}


@dataclass(frozen=True)
class Operand:
    value: str
    labels: tuple[str, ...]   # one per axis: a letter, or "...<k>" for ellipsis dim k
    shape: tuple[int, ...]


def _int64(values) -> np.ndarray:
    return shape_array(values)


def _split_term(node: OnnxNode, term: str, rank: int | None) -> tuple[list[str], int | None]:
    """Letters of a term with None where "..." stands, and the ellipsis' rank (None
    without one; `rank` None for the output term)."""
    if term.count(ELLIPSIS) > 1 or "." in term.replace(ELLIPSIS, ""):
        raise ModelError(f"{label(node)}: term '{term}' of the equation has a malformed "
                         f"ellipsis")
    before, _, after = term.partition(ELLIPSIS)
    for char in before + after:
        if not (char.isascii() and char.isalpha()):
            raise ModelError(f"{label(node)}: term '{term}' of the equation has label "
                             f"'{char}', expected ASCII letters and '...'")
    letters = len(before) + len(after)
    if ELLIPSIS not in term:
        if rank is not None and letters != rank:
            raise ModelError(f"{label(node)}: term '{term}' has {letters} labels for an "
                             f"operand of rank {rank}")
        return list(term), None
    if rank is not None and letters > rank:
        raise ModelError(f"{label(node)}: term '{term}' has {letters} labels for an operand "
                         f"of rank {rank}")
    return list(before) + [None] + list(after), None if rank is None else rank - letters


def _expand_ellipsis(parts: list, count: int, total: int) -> tuple[str, ...]:
    dims = [f"{ELLIPSIS}{k}" for k in range(total - count, total)]
    out: list[str] = []
    for part in parts:
        out.extend(dims if part is None else [part])
    return tuple(out)


def parse(node: OnnxNode, equation: str, ranks: list[int]
          ) -> tuple[list[tuple[str, ...]], tuple[str, ...]]:
    """Each operand's labels and the output's (ellipsis dims as "...<k>")."""
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ModelError(f"{label(node)}: equation '{equation}' has {len(terms)} input "
                         f"term(s), the node has {len(ranks)} input(s)")
    split = [_split_term(node, t, r) for t, r in zip(terms, ranks)]
    total = max((n for _, n in split if n is not None), default=0)
    inputs = [_expand_ellipsis(parts, n or 0, total) for parts, n in split]
    if not arrow:
        counts: dict[str, int] = {}
        for labels in inputs:
            for name in labels:
                counts[name] = counts.get(name, 0) + 1
        letters = sorted(n for n, c in counts.items() if c == 1 and ELLIPSIS not in n)
        return inputs, _expand_ellipsis([None], total, total) + tuple(letters)
    parts, _ = _split_term(node, rhs, None)
    if None not in parts and total:
        raise ModelError(f"{label(node)}: equation '{equation}': the output has no '...' "
                         f"for the inputs' {total} ellipsis dim(s)")
    output = _expand_ellipsis(parts, total, total)
    known = {n for labels in inputs for n in labels}
    for name in output:
        if name not in known or output.count(name) > 1:
            why = "twice" if name in known else "but in no input"
            raise ModelError(f"{label(node)}: equation '{equation}': output label "
                             f"'{name}' appears {why}")
    return inputs, output


def _sizes(node: OnnxNode, operands: list[Operand]) -> dict[str, int]:
    """Each label's size (numpy broadcasting: 1 against n gives n)."""
    sizes: dict[str, int] = {}
    for op in operands:
        for name, dim in zip(op.labels, op.shape):
            seen = sizes.get(name, 1)
            if dim != 1 and seen != 1 and dim != seen:
                raise ModelError(f"{label(node)}: label '{name}' has sizes {seen} and {dim}")
            sizes[name] = dim if seen == 1 else seen
    return sizes


class _Einsum:
    """The decomposition of one Einsum node, built step by step."""

    def __init__(self, node: OnnxNode, ctx: Context):
        self.node, self.build = node, Builder(node, ctx)

    def transpose(self, op: Operand, labels: tuple[str, ...]) -> Operand:
        """The operand with its axes in the order of `labels` (a permutation of its
        labels; a repeated label's axes keep their relative order)."""
        if labels == op.labels:
            return op
        free = list(range(len(op.labels)))
        perm = []
        for name in labels:
            axis = next(i for i in free if op.labels[i] == name)
            free.remove(axis)
            perm.append(axis)
        value = self.build.add("Transpose", [op.value], perm=tuple(perm))
        return Operand(value, labels, tuple(op.shape[p] for p in perm))

    def reshape(self, value: str, old: tuple[int, ...], new: tuple[int, ...]) -> str:
        if old == new:
            return value
        return self.build.add("Reshape", [value, self.build.const("shape", _int64(new))])

    def diagonal(self, op: Operand) -> Operand:
        """Take the diagonal of every label repeated within the operand."""
        for name in dict.fromkeys(op.labels):
            where = [i for i, n in enumerate(op.labels) if n == name]
            if len(where) < 2:
                continue
            n = op.shape[where[0]]
            if any(op.shape[i] != n for i in where):
                raise ModelError(f"{label(self.node)}: label '{name}' is repeated in one "
                                 f"operand with sizes {[op.shape[i] for i in where]}")
            rest = tuple(x for x in op.labels if x != name)
            moved = self.transpose(op, rest + (name,) * len(where))
            flat_shape = moved.shape[:len(rest)] + (n ** len(where),)
            flat = self.reshape(moved.value, moved.shape, flat_shape)
            step = sum(n ** j for j in range(len(where)))
            picks = self.build.const("diagonal", _int64(range(0, n * step, step)))
            value = self.build.add("Gather", [flat, picks], axis=len(rest))
            op = Operand(value, rest + (name,), moved.shape[:len(rest)] + (n,))
        return op

    def sum_out(self, op: Operand, keep: set[str]) -> Operand:
        axes = [i for i, n in enumerate(op.labels) if n not in keep]
        if not axes:
            return op
        value = self.build.add("ReduceSum", [op.value, self.build.const("axes", _int64(axes))],
                               keepdims=0)
        kept = [i for i in range(len(op.labels)) if i not in axes]
        return Operand(value, tuple(op.labels[i] for i in kept),
                       tuple(op.shape[i] for i in kept))

    def expand(self, op: Operand, sizes: dict[str, int], names: set[str]) -> Operand:
        """Broadcast the operand's size-1 dims of labels `names` to their full size."""
        shape = tuple(sizes[n] if n in names else d for n, d in zip(op.labels, op.shape))
        if shape == op.shape:
            return op
        value = self.build.add("Expand", [op.value, self.build.const("shape", _int64(shape))])
        return Operand(value, op.labels, shape)

    def contract(self, a: Operand, b: Operand, keep: set[str], sizes: dict[str, int]
                 ) -> Operand:
        """a x b over their shared labels not in `keep`: one MatMul, or one broadcasting
        Mul when nothing is summed."""
        a = self.sum_out(a, keep | set(b.labels))
        b = self.sum_out(b, keep | set(a.labels))
        shared = set(a.labels) & set(b.labels)
        batch = tuple(n for n in a.labels if n in shared and n in keep)
        summed = tuple(n for n in a.labels if n in shared and n not in keep)
        left = tuple(n for n in a.labels if n not in shared)
        right = tuple(n for n in b.labels if n not in shared)
        if not summed:
            return self.outer(a, b, right)
        a, b = self.expand(a, sizes, shared), self.expand(b, sizes, shared)
        a = self.transpose(a, batch + left + summed)
        b = self.transpose(b, batch + summed + right)
        dims = a.shape[:len(batch)]
        outer = a.shape[len(batch):len(batch) + len(left)] + b.shape[len(dims) + len(summed):]
        m, k, n = (math.prod(part) for part in (
            outer[:len(left)], b.shape[len(dims):len(dims) + len(summed)], outer[len(left):]))
        product = self.build.add("MatMul", [self.reshape(a.value, a.shape, dims + (m, k)),
                                            self.reshape(b.value, b.shape, dims + (k, n))])
        shape = dims + outer
        return Operand(self.reshape(product, dims + (m, n), shape), batch + left + right, shape)

    def outer(self, a: Operand, b: Operand, right: tuple[str, ...]) -> Operand:
        """a * b laid out as a's labels then b's own (numpy broadcasting aligns them)."""
        order = tuple(n for n in a.labels if n in b.labels) + right
        b = self.transpose(b, order)
        a_shape = a.shape + (1,) * len(right)
        dims = dict(zip(b.labels, b.shape))
        b_shape = tuple(dims.get(n, 1) for n in a.labels) + b.shape[len(b.labels) - len(right):]
        value = self.build.add("Mul", [self.reshape(a.value, a.shape, a_shape),
                                       self.reshape(b.value, b.shape, b_shape)])
        shape = tuple(max(x, y) for x, y in zip(a_shape, b_shape))
        return Operand(value, a.labels + right, shape)


def _write(build: Builder, value: str, out: str, fresh: bool) -> None:
    """Make `out` the result: rename the node that made `value` (a value of this
    decomposition) or copy it."""
    last = build.nodes[-1] if build.nodes and fresh else None
    if last is not None and last.outputs == (value,):
        build.nodes[-1] = last.with_(outputs=(out,), name=build.node.name)
    else:
        build.add("Identity", [value], out=out)


def einsum(node: OnnxNode, ctx: Context) -> Converted:
    if not node.inputs or not all(node.inputs):
        raise ModelError(f"{label(node)}: expected one or more inputs")
    types = [ctx.types[i] for i in node.inputs]
    dtype = types[0].dtype
    for i, t in enumerate(types):
        if t.dtype != dtype:
            raise ModelError(f"{label(node)}: input {i} has dtype {t.dtype}, expected "
                             f"{dtype} (input 0's)")
    equation = node.attrs.get("equation")
    if not isinstance(equation, str) or not equation.strip():
        raise ModelError(f"{label(node)}: attribute 'equation' is missing or empty")
    labels, output = parse(node, equation, [t.rank for t in types])
    work = _Einsum(node, ctx)
    build = work.build
    values = list(node.inputs)
    if dtype in WIDE:
        values = [build.add("Cast", [v], to=WIDE[dtype]) for v in values]
    operands = [Operand(v, names, t.shape) for v, names, t in zip(values, labels, types)]
    sizes = _sizes(node, operands)
    operands = [work.diagonal(op) for op in operands]
    result = operands[0]
    for i, other in enumerate(operands[1:], start=1):
        keep = set(output).union(*(op.labels for op in operands[i + 1:]))
        result = work.contract(result, other, keep, sizes)
    result = work.sum_out(result, set(output))
    result = work.expand(result, sizes, set(output))
    result = work.transpose(result, output)
    value = result.value
    if dtype in WIDE:
        value = build.add("Cast", [value], to=dtype)
    _write(build, value, node.outputs[0], value not in node.inputs)
    return build.done()


HANDLERS = {"Einsum": einsum}
EXTRA_OPS: tuple[str, ...] = ("Einsum",)
CHECKED: tuple[str, ...] = ("Einsum",)
FIRST_VERSION: dict[str, int] = {}
