"""Indexing ops: Gather, GatherElements, GatherND, Trilu (INJECTIVE) and ScatterND,
ScatterElements (OTHER: which element lands where depends on data), NonZero (OTHER: its
output SHAPE depends on the data, so it is accepted only with a constant input, which
constant folding evaluates; otherwise shape inference refuses it with a ShapeError).

Assumes ONNX semantics: indices may be negative (counted from the end); out-of-range
indices are an error at run time (the reference raises ValueError; shapes do not depend
on index values). Guarantees: output shapes follow ONNX, including GatherND batch_dims
and GatherElements with indices smaller than data on non-gather axes.
"""
from __future__ import annotations

import math

import numpy as np

from hidetc.graph.ir import TensorType
from hidetc.graph.ops.common import (
    INDEX,
    arity,
    dtype_in,
    fail,
    fmt,
    norm_axis,
    present,
    rank_at_least,
    same_dtype,
)
from hidetc.graph.ops.registry import OpKind, define


def normalize_indices(op: str, indices: np.ndarray, dim) -> np.ndarray:
    """Map indices in [-dim, dim) to [0, dim); raise ValueError outside that range."""
    indices = indices.astype(np.int64)
    dim = np.asarray(dim, dtype=np.int64)
    bad = (indices < -dim) | (indices >= dim)
    if np.any(bad):
        first = int(indices[bad].ravel()[0])
        raise ValueError(f"{op}: index {first} is out of range for dim size "
                         f"{int(np.broadcast_to(dim, indices.shape)[bad].ravel()[0])}")
    return np.where(indices < 0, indices + dim, indices)


def _gather_infer(types, attrs, values):
    arity("Gather", types, 2)
    dtype_in("Gather", types, 1, INDEX)
    rank_at_least("Gather", types, 0, 1)
    data = types[0].shape
    axis = norm_axis("Gather", attrs.get("axis", 0), len(data))
    return [TensorType(types[0].dtype, data[:axis] + types[1].shape + data[axis + 1:])]


def _gather_ref(inputs, attrs):
    data, indices = inputs
    axis = attrs.get("axis", 0) % data.ndim
    index = normalize_indices("Gather", indices, data.shape[axis])
    return [np.take(data, index, axis=axis)]


def _gather_elements_infer(types, attrs, values):
    arity("GatherElements", types, 2)
    dtype_in("GatherElements", types, 1, INDEX)
    data, indices = types[0].shape, types[1].shape
    if len(data) != len(indices) or not data:
        fail("GatherElements", f"input 1 has shape {fmt(indices)}, expected the same rank as "
                               f"input 0 {fmt(data)}")
    axis = norm_axis("GatherElements", attrs.get("axis", 0), len(data))
    for i, (d, n) in enumerate(zip(data, indices)):
        if i != axis and n > d:
            fail("GatherElements", f"input 1 has shape {fmt(indices)}: dim {i} exceeds {d} of "
                                   f"input 0 {fmt(data)}")
    return [TensorType(types[0].dtype, indices)]


def _gather_elements_ref(inputs, attrs):
    data, indices = inputs
    axis = attrs.get("axis", 0) % data.ndim
    crop = tuple(slice(None) if i == axis else slice(0, n) for i, n in enumerate(indices.shape))
    index = normalize_indices("GatherElements", indices, data.shape[axis])
    return [np.take_along_axis(data[crop], index, axis=axis)]


def _gather_nd_infer(types, attrs, values):
    arity("GatherND", types, 2)
    dtype_in("GatherND", types, 1, ("int64",))
    rank_at_least("GatherND", types, 1, 1)
    data, indices = types[0].shape, types[1].shape
    b = attrs.get("batch_dims", 0)
    if not 0 <= b < min(len(data), len(indices)) or data[:b] != indices[:b]:
        fail("GatherND", f"batch_dims={b}: input 1 {fmt(indices)} and input 0 {fmt(data)} "
                         f"must share their first {b} dims")
    last = indices[-1]
    if last > len(data) - b:
        fail("GatherND", f"input 1 has shape {fmt(indices)}: last dim {last} exceeds the "
                         f"rank {len(data)} of input 0 minus batch_dims {b}")
    return [TensorType(types[0].dtype, indices[:-1] + data[b + last:])]


def _gather_nd_ref(inputs, attrs):
    data, indices = inputs
    b = attrs.get("batch_dims", 0)
    last = indices.shape[-1]
    batch = math.prod(data.shape[:b])
    flat = data.reshape((batch,) + data.shape[b:])
    index = indices.reshape(batch, -1, last)
    index = normalize_indices("GatherND", index, np.array(data.shape[b:b + last]))
    rows = np.arange(batch)[:, None]
    picked = flat[(rows,) + tuple(index[..., i] for i in range(last))]
    return [picked.reshape(indices.shape[:-1] + data.shape[b + last:])]


REDUCTIONS = {"none": None, "add": np.add, "mul": np.multiply, "max": np.maximum,
              "min": np.minimum}


def _scatter_check(name: str, types, attrs) -> None:
    arity(name, types, 3)
    dtype_in(name, types, 1, INDEX)
    same_dtype(name, types, [0, 2])
    if attrs.get("reduction", "none") not in REDUCTIONS:
        fail(name, f"reduction={attrs.get('reduction')!r} is not one of {', '.join(REDUCTIONS)}")


def _scatter_nd_infer(types, attrs, values):
    _scatter_check("ScatterND", types, attrs)
    data, indices, updates = (t.shape for t in types)
    rank_at_least("ScatterND", types, 1, 1)
    want = indices[:-1] + data[indices[-1]:]
    if indices[-1] > len(data) or updates != want:
        fail("ScatterND", f"input 2 has shape {fmt(updates)}, expected {fmt(want)} for input 0 "
                          f"{fmt(data)} and input 1 {fmt(indices)}")
    return [types[0]]


def _scatter(out: np.ndarray, where: tuple, updates: np.ndarray, reduction: str) -> np.ndarray:
    fn = REDUCTIONS[reduction]
    if fn is None:
        out[where] = updates
    else:
        fn.at(out, where, updates)
    return out


def _scatter_nd_ref(inputs, attrs):
    data, indices, updates = inputs
    last = indices.shape[-1]
    index = normalize_indices("ScatterND", indices.reshape(-1, last), np.array(data.shape[:last]))
    flat_updates = updates.reshape((-1,) + data.shape[last:])
    where = tuple(index[:, i] for i in range(last))
    return [_scatter(data.copy(), where, flat_updates, attrs.get("reduction", "none"))]


def _scatter_elements_infer(types, attrs, values):
    _scatter_check("ScatterElements", types, attrs)
    data, indices, updates = (t.shape for t in types)
    if len(indices) != len(data) or updates != indices:
        fail("ScatterElements", f"input 1 {fmt(indices)} and input 2 {fmt(updates)} must have "
                                f"equal shapes of the rank of input 0 {fmt(data)}")
    norm_axis("ScatterElements", attrs.get("axis", 0), len(data))
    return [types[0]]


def _scatter_elements_ref(inputs, attrs):
    data, indices, updates = inputs
    axis = attrs.get("axis", 0) % data.ndim
    index = normalize_indices("ScatterElements", indices, data.shape[axis])
    grid = list(np.indices(indices.shape, sparse=True))
    grid[axis] = index
    return [_scatter(data.copy(), tuple(grid), updates, attrs.get("reduction", "none"))]


def _trilu_infer(types, attrs, values):
    arity("Trilu", types, 1, 2)
    rank_at_least("Trilu", types, 0, 2)
    if present(types, 1):
        dtype_in("Trilu", types, 1, ("int64",))
    return [types[0]]


def _trilu_ref(inputs, attrs):
    x = inputs[0]
    k = int(inputs[1].reshape(())) if len(inputs) > 1 and inputs[1] is not None else 0
    fn = np.triu if attrs.get("upper", 1) else np.tril
    return [fn(x, k).astype(x.dtype, copy=False)]


def _nonzero_infer(types, attrs, values):
    arity("NonZero", types, 1)
    value = values[0] if values else None
    if value is None:
        fail("NonZero", "input 0 must be a constant known at compile time (the output "
                        "shape depends on the input values: data-dependent shapes are not "
                        "supported)")
    count = int(np.count_nonzero(value))
    return [TensorType("int64", (max(types[0].rank, 1), count))]


def _nonzero_ref(inputs, attrs):
    return [np.array(np.nonzero(np.atleast_1d(inputs[0])), dtype=np.int64)
            .reshape(max(inputs[0].ndim, 1), -1)]


define("Gather", OpKind.INJECTIVE, _gather_infer, _gather_ref)
define("GatherElements", OpKind.INJECTIVE, _gather_elements_infer, _gather_elements_ref)
define("GatherND", OpKind.INJECTIVE, _gather_nd_infer, _gather_nd_ref)
define("Trilu", OpKind.INJECTIVE, _trilu_infer, _trilu_ref)
define("ScatterND", OpKind.OTHER, _scatter_nd_infer, _scatter_nd_ref)
define("ScatterElements", OpKind.OTHER, _scatter_elements_infer, _scatter_elements_ref)
define("NonZero", OpKind.OTHER, _nonzero_infer, _nonzero_ref, value_inputs=(0,))
