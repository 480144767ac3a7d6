"""Reductions: Reduce{Mean,Sum,Max,Min,Prod,L1,L2,SumSquare,LogSum,LogSumExp}, ArgMax,
ArgMin, CumSum, CumProd.

Assumes the opset-18 form: `axes` is an optional second INPUT (the frontend turns the
older attribute into a constant input) and must be a compile-time constant; attributes
`keepdims` (default 1) and `noop_with_empty_axes` (default 0); a no-op reduction still
applies the elementwise part (ReduceSumSquare -> x*x, ReduceLogSum -> log x), as ONNX
Runtime and the ONNX reference do. Guarantees: float sums,
means and products accumulate in float64 and round back to the input dtype; output
dtype equals the input dtype (int64 for ArgMax/ArgMin). All are REDUCE.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from hidetc.graph.ir import FLOAT_DTYPES, TensorType
from hidetc.graph.ops.common import (
    INDEX,
    NUMERIC,
    arity,
    dtype_in,
    fail,
    fmt,
    int_list,
    norm_axes,
    norm_axis,
    present,
)
from hidetc.graph.ops.registry import OpKind, define

Reducer = Callable[[np.ndarray, tuple[int, ...]], np.ndarray]


def _acc(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64) if _is_float(x) else x


def _is_float(x: np.ndarray) -> bool:
    return x.dtype.kind == "f" or x.dtype.name == "bfloat16"   # ml_dtypes' kind is "V"


def _sum(x, axes):
    return np.sum(_acc(x), axis=axes, keepdims=True)


def _extreme(x: np.ndarray, high: bool):
    """The identity of max (high=False) or min (high=True): an empty set reduces to it."""
    if x.dtype == np.bool_:
        return high
    if _is_float(x):
        return np.inf if high else -np.inf
    info = np.iinfo(x.dtype)
    return info.max if high else info.min


def _logsumexp(x, axes):
    x = _acc(x)
    peak = np.max(x, axis=axes, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    return np.log(np.sum(np.exp(x - peak), axis=axes, keepdims=True)) + peak


# name -> (reducer(x, axes) with keepdims=True, allowed dtypes)
REDUCERS: dict[str, tuple[Reducer, tuple[str, ...]]] = {
    "ReduceSum": (_sum, NUMERIC),
    "ReduceMean": (lambda x, a: np.mean(_acc(x), axis=a, keepdims=True), NUMERIC),
    "ReduceMax": (lambda x, a: np.max(x, axis=a, keepdims=True, initial=_extreme(x, False)),
                  NUMERIC + ("bool",)),
    "ReduceMin": (lambda x, a: np.min(x, axis=a, keepdims=True, initial=_extreme(x, True)),
                  NUMERIC + ("bool",)),
    "ReduceProd": (lambda x, a: np.prod(_acc(x), axis=a, keepdims=True), NUMERIC),
    "ReduceL1": (lambda x, a: _sum(np.abs(x), a), NUMERIC),
    "ReduceL2": (lambda x, a: np.sqrt(_sum(_acc(x) * _acc(x), a)), NUMERIC),
    "ReduceSumSquare": (lambda x, a: _sum(_acc(x) * _acc(x), a), NUMERIC),
    "ReduceLogSum": (lambda x, a: np.log(_sum(x, a)), FLOAT_DTYPES),
    "ReduceLogSumExp": (_logsumexp, FLOAT_DTYPES),
}


def reduce_axes(op: str, types, attrs: dict, values) -> tuple[int, ...] | None:
    """The normalized reduction axes; None means "no reduction" (noop_with_empty_axes)."""
    rank = types[0].rank
    axes = int_list(op, values, 1, "axes") if present(types, 1) else []
    if not axes:
        return None if attrs.get("noop_with_empty_axes", 0) else tuple(range(rank))
    return tuple(sorted(norm_axes(op, axes, rank)))


def _reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool):
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_infer(name: str, allowed: tuple[str, ...]):
    def infer(types, attrs, values):
        arity(name, types, 1, 2)
        dtype = dtype_in(name, types, 0, allowed)
        if present(types, 1):
            dtype_in(name, types, 1, ("int64",))
        axes = reduce_axes(name, types, attrs, values)
        if axes is None:
            return [types[0]]
        return [TensorType(dtype, _reduced_shape(types[0].shape, axes, attrs.get("keepdims", 1)))]
    return infer


def _reduce_ref(name: str, fn: Reducer):
    def reference(inputs, attrs):
        x = inputs[0]
        axes_value = inputs[1] if len(inputs) > 1 and inputs[1] is not None else None
        axes = [] if axes_value is None else [int(a) for a in axes_value.ravel()]
        if axes:
            axes = tuple(sorted(a % x.ndim for a in axes))
        else:  # noop still applies the elementwise part (ReduceSumSquare -> x*x), as ORT
            axes = () if attrs.get("noop_with_empty_axes", 0) else tuple(range(x.ndim))
        result = np.asarray(fn(x, axes))
        if not attrs.get("keepdims", 1):
            result = result.reshape(_reduced_shape(x.shape, axes, False))
        return [result.astype(x.dtype)]
    return reference


def _arg_infer(name: str):
    def infer(types, attrs, values):
        arity(name, types, 1)
        dtype_in(name, types, 0, NUMERIC)
        rank = types[0].rank
        axis = norm_axis(name, attrs.get("axis", 0), max(rank, 1))
        if rank and types[0].shape[axis] == 0:
            fail(name, f"input 0 has shape {fmt(types[0].shape)}: axis {axis} is empty")
        shape = _reduced_shape(types[0].shape, (axis,), attrs.get("keepdims", 1))
        return [TensorType("int64", shape)]
    return infer


def _arg_ref(fn: Callable[..., np.ndarray]):
    def reference(inputs, attrs):
        x = inputs[0]
        axis = attrs.get("axis", 0) % max(x.ndim, 1)
        if attrs.get("select_last_index", 0):
            index = x.shape[axis] - 1 - fn(np.flip(x, axis), axis=axis, keepdims=True)
        else:
            index = fn(x, axis=axis, keepdims=True)
        if not attrs.get("keepdims", 1):
            index = np.squeeze(index, axis)
        return [np.asarray(index, dtype=np.int64)]
    return reference


def _cum_infer(op: str):
    def infer(types, attrs, values):
        arity(op, types, 2)
        dtype = dtype_in(op, types, 0, NUMERIC)
        dtype_in(op, types, 1, INDEX)
        if types[1].size != 1:
            fail(op, f"input 1 (axis) has shape {fmt(types[1].shape)}, expected a scalar")
        return [TensorType(dtype, types[0].shape)]
    return infer


def _cum_ref(scan: Callable[..., np.ndarray], identity: int):
    """CumSum (np.cumsum, 0) / CumProd (np.cumprod, 1): exclusive shifts the identity in."""
    def reference(inputs, attrs):
        x = inputs[0]
        axis = int(inputs[1].reshape(())) % max(x.ndim, 1)
        data = np.flip(x, axis) if attrs.get("reverse", 0) else x
        out = scan(_acc(data), axis=axis)
        if attrs.get("exclusive", 0):
            out = np.concatenate([np.full_like(np.take(out, [0], axis), identity),
                                  np.take(out, range(out.shape[axis] - 1), axis)], axis)
        out = np.flip(out, axis) if attrs.get("reverse", 0) else out
        return [out.astype(x.dtype)]
    return reference


def _register() -> None:
    for name, (fn, allowed) in REDUCERS.items():
        define(name, OpKind.REDUCE, _reduce_infer(name, allowed), _reduce_ref(name, fn),
               value_inputs=(1,))
    define("ArgMax", OpKind.REDUCE, _arg_infer("ArgMax"), _arg_ref(np.argmax))
    define("ArgMin", OpKind.REDUCE, _arg_infer("ArgMin"), _arg_ref(np.argmin))
    define("CumSum", OpKind.REDUCE, _cum_infer("CumSum"), _cum_ref(np.cumsum, 0))
    define("CumProd", OpKind.REDUCE, _cum_infer("CumProd"), _cum_ref(np.cumprod, 1))


_register()
