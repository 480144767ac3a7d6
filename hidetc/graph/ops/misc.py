"""Shape-level and generator ops (OTHER): Shape, Size, ConstantOfShape, Range, Identity,
Dropout (inference), OneHot.

Assumes canonical attributes: ConstantOfShape carries `value` (a Python scalar, default
0.0) and `dtype` (a dtype name, default "float32") instead of ONNX's tensor attribute.
Dropout's training_mode input, when present, must be a known false value. Guarantees:
Shape/Size depend only on the input TYPE (see `shape_value`), so they are always
foldable for our statically shaped graphs. Range accumulates `start + delta + ...` in
its dtype exactly as the ONNX function body does.
"""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import DTYPES, FLOAT_DTYPES, TensorType
from hidetc.graph.ops.common import (
    INDEX,
    arity,
    dtype_in,
    fail,
    fmt,
    int_list,
    need,
    norm_axis,
    present,
    same_dtype,
)
from hidetc.graph.ops.registry import OpKind, define
from hidetc.graph.symbolic import Dim, SymDim


def shape_range(rank: int, attrs: dict) -> tuple[int, int]:
    """Clamped [start, end) of the Shape op's start/end attributes."""
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return start, max(start, end)


def shape_value(op: str, t: TensorType, attrs: dict) -> np.ndarray:
    """The value of Shape or Size applied to a value of type t: int64, or an object
    array of ints and SymDims where t is symbolic (`hidetc.graph.symbolic`: a shape
    value folded through the shape subgraph as expressions)."""
    if op == "Size":
        return np.array(t.size, dtype=object if t.symbolic else np.int64)
    start, end = shape_range(t.rank, attrs)
    dims = t.shape[start:end]
    return np.array(dims, dtype=object if t.symbolic else np.int64)


def _shape_infer(types, attrs, values):
    arity("Shape", types, 1)
    start, end = shape_range(types[0].rank, attrs)
    return [TensorType("int64", (end - start,))]


def _size_infer(types, attrs, values):
    arity("Size", types, 1)
    return [TensorType("int64", ())]


def _type_value_ref(op: str):
    return lambda inputs, attrs: [shape_value(op, TensorType.of(inputs[0]), attrs)]


def _constant_of_shape_infer(types, attrs, values):
    arity("ConstantOfShape", types, 1)
    dtype_in("ConstantOfShape", types, 0, ("int64",))
    shape = int_list("ConstantOfShape", values, 0, "shape")
    if any(d < 0 for d in shape):
        fail("ConstantOfShape", f"input 0 (shape) {shape} has negative dims")
    dtype = attrs.get("dtype", "float32")
    if dtype not in DTYPES:
        fail("ConstantOfShape", f"attribute dtype={dtype!r} is not a supported dtype")
    return [TensorType(dtype, tuple(shape))]


def _constant_of_shape_ref(inputs, attrs):
    shape = tuple(int(d) for d in inputs[0].ravel())
    return [np.full(shape, attrs.get("value", 0.0), dtype=attrs.get("dtype", "float32"))]


RANGE_DTYPES = ("float32", "float64", "int16", "int32", "int64")


def range_length(op: str, start, limit, delta) -> Dim:
    """max(ceil((limit - start) / delta), 0); a symbolic (integer) limit or start with
    a positive constant delta gives a symbolic length."""
    values = [v.item() if isinstance(v, np.ndarray) and v.dtype == object else v
              for v in (start, limit, delta)]
    if any(isinstance(v, SymDim) for v in values):
        start, limit, delta = values
        if isinstance(delta, SymDim) or int(delta) <= 0:
            fail(op, f"a symbolic range ({start} to {limit}) needs a positive constant delta, "
                     f"got {delta}")
        length = (limit - start + int(delta) - 1) // int(delta)
        if isinstance(length, SymDim) and length.lower_bound() < 0:
            fail(op, f"the length of the range {start} to {limit} may be negative")
        return max(length, 0) if isinstance(length, int) else length
    if delta == 0:
        fail(op, "input 2 (delta) is zero")
    return max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)


def _range_infer(types, attrs, values):
    arity("Range", types, 3)
    dtype = dtype_in("Range", types, 0, RANGE_DTYPES)
    same_dtype("Range", types, [0, 1, 2])
    args = []
    for i, what in enumerate(("start", "limit", "delta")):
        value = need("Range", values, i, what)
        if value.size != 1:
            fail("Range", f"input {i} ({what}) has shape {fmt(value.shape)}, expected a scalar")
        args.append(value.reshape(()))
    return [TensorType(dtype, (range_length("Range", *args),))]


def _range_ref(inputs, attrs):
    start, limit, delta = (v.reshape(()) for v in inputs)
    n = range_length("Range", start, limit, delta)
    if start.dtype.kind != "f":
        return [(start + np.arange(n, dtype=start.dtype) * delta).astype(start.dtype)]
    steps = np.full(n, delta, dtype=start.dtype)
    if n:
        steps[0] = start
    return [np.cumsum(steps, dtype=start.dtype)]


def _identity_infer(types, attrs, values):
    arity("Identity", types, 1)
    return [types[0]]


def _dropout_infer(types, attrs, values):
    arity("Dropout", types, 1, 3)
    if present(types, 1):
        dtype_in("Dropout", types, 1, FLOAT_DTYPES)
    if present(types, 2) and bool(np.any(need("Dropout", values, 2, "training_mode"))):
        fail("Dropout", "training_mode=true is not supported (inference only)")
    return [types[0], TensorType("bool", types[0].shape)]


def _dropout_ref(inputs, attrs):
    return [inputs[0], np.ones(inputs[0].shape, dtype=bool)]


def _onehot_infer(types, attrs, values):
    arity("OneHot", types, 3)
    dtype_in("OneHot", types, 0, INDEX + FLOAT_DTYPES)
    if types[2].shape != (2,):
        fail("OneHot", f"input 2 (values) has shape {fmt(types[2].shape)}, expected [2]")
    depth = need("OneHot", values, 1, "depth")
    if depth.size != 1 or int(depth.reshape(())) < 1:
        fail("OneHot", f"input 1 (depth) must be a positive scalar, got {depth.tolist()}")
    shape = types[0].shape
    axis = norm_axis("OneHot", attrs.get("axis", -1), len(shape) + 1)
    out = shape[:axis] + (int(depth.reshape(())),) + shape[axis:]
    return [TensorType(types[2].dtype, out)]


def _onehot_ref(inputs, attrs):
    indices, depth, values = inputs
    depth = int(depth.reshape(()))
    axis = attrs.get("axis", -1) % (indices.ndim + 1)
    index = indices.astype(np.int64)
    index = np.where(index < 0, index + depth, index)
    hot = np.expand_dims(index, axis) == np.arange(depth).reshape(
        (-1,) + (1,) * (indices.ndim - axis))
    return [np.where(hot, values[1], values[0]).astype(values.dtype)]


define("Shape", OpKind.OTHER, _shape_infer, _type_value_ref("Shape"))
define("Size", OpKind.OTHER, _size_infer, _type_value_ref("Size"))
define("ConstantOfShape", OpKind.OTHER, _constant_of_shape_infer, _constant_of_shape_ref,
       value_inputs=(0,))
define("Range", OpKind.OTHER, _range_infer, _range_ref, value_inputs=(0, 1, 2))
define("Identity", OpKind.OTHER, _identity_infer, lambda inputs, attrs: [inputs[0]])
define("Dropout", OpKind.OTHER, _dropout_infer, _dropout_ref, value_inputs=(2,))
define("OneHot", OpKind.OTHER, _onehot_infer, _onehot_ref, value_inputs=(1,))
