"""Shared checks and helpers for op definitions.

Assumes: callers pass the `types`/`values` sequences of the registry contract (None for
an omitted optional input). Guarantees: every failed check raises `ShapeError` with a
one-line message starting with "<Op>: " and naming the input, what was expected and what
was found; shapes print as "[3,4]".
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

import ml_dtypes  # (also registers the "bfloat16" dtype name with numpy)
import numpy as np

from hidetc.errors import ShapeError
from hidetc.graph.ir import DTYPES, FLOAT_DTYPES, TensorType
from hidetc.graph.symbolic import SymDim, as_dim

SIGNED_INTS = ("int8", "int16", "int32", "int64")
UNSIGNED_INTS = ("uint8", "uint16", "uint32", "uint64")
INTS = SIGNED_INTS + UNSIGNED_INTS
NUMERIC = FLOAT_DTYPES + INTS
SIGNED = FLOAT_DTYPES + SIGNED_INTS
INDEX = ("int32", "int64")
ANY = DTYPES

Types = Sequence[Optional[TensorType]]
Values = Sequence[Optional[np.ndarray]]


def fmt(shape: Iterable[int]) -> str:
    return "[" + ",".join(str(d if isinstance(d, SymDim) else int(d)) for d in shape) + "]"


def fail(op: str, message: str) -> None:
    raise ShapeError(f"{op}: {message}")


def arity(op: str, types: Types, low: int, high: int | None = None) -> None:
    """Check the input count and that the first `low` (required) inputs are present."""
    high = low if high is None else high
    if not low <= len(types) <= high:
        want = str(low) if low == high else f"{low} to {high}"
        fail(op, f"expects {want} inputs, got {len(types)}")
    for i in range(low):
        if types[i] is None:
            fail(op, f"input {i} is required but omitted")


def present(types: Types, i: int) -> bool:
    return i < len(types) and types[i] is not None


def dtype_in(op: str, types: Types, i: int, allowed: Sequence[str]) -> str:
    dtype = types[i].dtype
    if dtype not in allowed:
        fail(op, f"input {i} has dtype {dtype}, expected one of {', '.join(allowed)}")
    return dtype


def same_dtype(op: str, types: Types, indices: Sequence[int]) -> str:
    first = types[indices[0]].dtype
    for i in indices[1:]:
        if types[i] is not None and types[i].dtype != first:
            fail(op, f"input {i} has dtype {types[i].dtype}, expected {first} "
                     f"(dtype of input {indices[0]})")
    return first


def rank_is(op: str, types: Types, i: int, ranks: Sequence[int]) -> None:
    rank = types[i].rank
    if rank not in ranks:
        want = " or ".join(str(r) for r in ranks)
        fail(op, f"input {i} has rank {rank} (shape {fmt(types[i].shape)}), expected rank {want}")


def rank_at_least(op: str, types: Types, i: int, low: int) -> None:
    if types[i].rank < low:
        fail(op, f"input {i} has shape {fmt(types[i].shape)}, expected rank >= {low}")


def norm_axis(op: str, axis: int, rank: int, what: str = "axis") -> int:
    """Map an axis in [-rank, rank) to [0, rank)."""
    if not -rank <= axis < rank:
        fail(op, f"{what} {axis} is out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def norm_axes(op: str, axes: Iterable[int], rank: int, what: str = "axes") -> tuple[int, ...]:
    result = tuple(norm_axis(op, int(a), rank, what) for a in axes)
    if len(set(result)) != len(result):
        fail(op, f"{what} {list(result)} contain duplicates")
    return result


def need(op: str, values: Values, i: int, what: str) -> np.ndarray:
    """The constant value of input i, which shape inference needs."""
    value = values[i] if i < len(values) else None
    if value is None:
        fail(op, f"input {i} ({what}) must be a constant known at compile time")
    return value


def int_list(op: str, values: Values, i: int, what: str, rank: int = 1) -> list[int]:
    """A constant 1-D (or scalar with rank=0 allowed) integer input as a Python list (of
    ints, and SymDims where the value is a symbolic shape)."""
    value = need(op, values, i, what)
    if value.dtype == object:           # a shape value with symbolic sizes (SymDims)
        if value.ndim > rank:
            fail(op, f"input {i} ({what}) has shape {fmt(value.shape)}, expected a 1-D tensor")
        return [as_dim(v) for v in np.ravel(value)]
    if value.dtype.kind not in "iu":
        fail(op, f"input {i} ({what}) has dtype {value.dtype}, expected an integer dtype")
    if value.ndim > rank:
        fail(op, f"input {i} ({what}) has shape {fmt(value.shape)}, expected a 1-D tensor")
    return [int(v) for v in np.ravel(value)]


def broadcast(op: str, shapes: Sequence[Sequence[int]]) -> tuple[int, ...]:
    """Multidirectional (numpy) broadcasting of several shapes."""
    result: tuple[int, ...] = ()
    for i, shape in enumerate(shapes):
        result = _broadcast_two(op, result, tuple(shape), i)
    return result


def _broadcast_two(op: str, a: tuple[int, ...], b: tuple[int, ...], index: int) -> tuple[int, ...]:
    rank = max(len(a), len(b))
    pa = (1,) * (rank - len(a)) + a
    pb = (1,) * (rank - len(b)) + b
    out = []
    for x, y in zip(pa, pb):
        if x != y and x != 1 and y != 1:
            fail(op, f"input {index} has shape {fmt(b)}, not broadcastable with {fmt(a)}")
        out.append(y if x == 1 else x)
    return tuple(out)


def unidirectional(op: str, target: Sequence[int], shape: Sequence[int], index: int) -> None:
    """Check that `shape` broadcasts to `target` without changing it."""
    tail = tuple(target)[len(target) - len(shape):] if len(shape) <= len(target) else None
    if tail is None or any(s != t and s != 1 for s, t in zip(shape, tail)):
        fail(op, f"input {index} has shape {fmt(shape)}, not broadcastable to {fmt(target)}")


def bf16_operands(inputs: Sequence[np.ndarray], attrs) -> list:
    """The operands of a product-summing op (MatMul, Conv) as it computes them: rounded to
    bf16 (nearest even) and back to float32 when the node has `compute="bfloat16"`
    (`hidetc.graph.passes.compute_bf16`), else as they are."""
    if attrs.get("compute") != "bfloat16":
        return list(inputs)
    return [x.astype(ml_dtypes.bfloat16).astype(np.float32) for x in inputs]


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype to compute a float reduction in: f16 and bf16 widen to f32."""
    return np.dtype("float32") if str(dtype) in ("float16", "bfloat16") else np.dtype(dtype)


def attr_ints(attrs: dict, key: str, default: Sequence[int] | None) -> list[int] | None:
    value = attrs.get(key, default)
    return None if value is None else [int(v) for v in value]
