"""Normalizations and one-hot maxima beyond `nn`: GroupNormalization,
MeanVarianceNormalization, Hardmax (REDUCE) and LRN (INJECTIVE: each output element is
a function of a small channel window of the input).

Assumes ONNX semantics (opset 13+ forms; GroupNormalization's opset-21 per-channel
scale and bias of shape [C], and also the deprecated opset-18 per-group [num_groups]
form, recognized by its shape: the two coincide when num_groups == C, so the shape
decides unambiguously). Guarantees: references compute in float64 and round back to the
input dtype, following the ONNX definitions exactly: GroupNormalization uses the
population variance over each group (C / num_groups channels x all spatial elements);
MeanVarianceNormalization is ONNX's function body `(X - E[X]) / (sqrt(E[X^2] - E[X]^2)
+ 1e-9)` over `axes` (default [0, 2, 3]); Hardmax puts 1 at the FIRST maximum along
`axis` (default -1; NaN counts as the maximum, as numpy's argmax); LRN sums squares
over channels [c - floor((size-1)/2), c + ceil((size-1)/2)] clipped to the tensor.
"""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import FLOAT_DTYPES, TensorType
from hidetc.graph.ops.common import (
    arity,
    attr_ints,
    dtype_in,
    fail,
    fmt,
    norm_axes,
    norm_axis,
    rank_at_least,
    same_dtype,
)
from hidetc.graph.ops.registry import OpKind, define


def group_params(types, attrs) -> tuple[int, bool]:
    """(num_groups, per_group): whether scale/bias have the opset-18 [num_groups] form."""
    channels = types[0].shape[1]
    groups = int(attrs.get("num_groups", 0))
    if groups < 1 or channels % groups:
        fail("GroupNormalization", f"num_groups={groups} must be positive and divide the "
                                   f"{channels} channels of input 0 {fmt(types[0].shape)}")
    per_group = False
    for i in (1, 2):
        shape = types[i].shape
        if shape == (groups,) and groups != channels:
            per_group = True
        elif shape != (channels,):
            fail("GroupNormalization", f"input {i} has shape {fmt(shape)}, expected "
                                       f"[{channels}] (channels of input 0)")
    if per_group and not all(types[i].shape == (groups,) for i in (1, 2)):
        fail("GroupNormalization", "inputs 1 and 2 must both be per channel or per group")
    return groups, per_group


def _groupnorm_infer(types, attrs, values):
    arity("GroupNormalization", types, 3)
    dtype = dtype_in("GroupNormalization", types, 0, FLOAT_DTYPES)
    same_dtype("GroupNormalization", types, [0, 1, 2])
    rank_at_least("GroupNormalization", types, 0, 2)
    group_params(types, attrs)
    return [TensorType(dtype, types[0].shape)]


def _groupnorm_ref(inputs, attrs):
    x, scale, bias = inputs
    n, c = x.shape[:2]
    groups = int(attrs["num_groups"])
    if scale.shape == (groups,) and groups != c:
        scale, bias = np.repeat(scale, c // groups), np.repeat(bias, c // groups)
    w = x.astype(np.float64).reshape(n, groups, -1)
    mean = w.mean(axis=2, keepdims=True)
    var = np.square(w - mean).mean(axis=2, keepdims=True)
    y = ((w - mean) / np.sqrt(var + attrs.get("epsilon", 1e-5))).reshape(x.shape)
    shape = (1, c) + (1,) * (x.ndim - 2)
    y = y * scale.astype(np.float64).reshape(shape) + bias.astype(np.float64).reshape(shape)
    return [y.astype(x.dtype)]


def mvn_axes(rank: int, attrs) -> tuple[int, ...]:
    return tuple(sorted(norm_axes("MeanVarianceNormalization",
                                  attr_ints(attrs, "axes", [0, 2, 3]), rank)))


def _mvn_infer(types, attrs, values):
    arity("MeanVarianceNormalization", types, 1)
    dtype_in("MeanVarianceNormalization", types, 0, FLOAT_DTYPES)
    mvn_axes(types[0].rank, attrs)
    return [types[0]]


def _mvn_ref(inputs, attrs):
    x = inputs[0]
    axes = tuple(sorted(a % x.ndim for a in attr_ints(attrs, "axes", [0, 2, 3])))
    w = x.astype(np.float64)
    mean = np.mean(w, axis=axes, keepdims=True)
    var = np.mean(w * w, axis=axes, keepdims=True) - mean * mean
    return [((w - mean) / (np.sqrt(var) + 1e-9)).astype(x.dtype)]


def _hardmax_infer(types, attrs, values):
    arity("Hardmax", types, 1)
    dtype_in("Hardmax", types, 0, FLOAT_DTYPES)
    rank_at_least("Hardmax", types, 0, 1)
    norm_axis("Hardmax", attrs.get("axis", -1), types[0].rank)
    return [types[0]]


def _hardmax_ref(inputs, attrs):
    x = inputs[0]
    axis = attrs.get("axis", -1) % x.ndim
    top = np.expand_dims(np.argmax(x, axis=axis), axis)
    hot = np.arange(x.shape[axis]).reshape((-1,) + (1,) * (x.ndim - axis - 1)) == top
    return [hot.astype(x.dtype)]


def _lrn_infer(types, attrs, values):
    arity("LRN", types, 1)
    dtype_in("LRN", types, 0, FLOAT_DTYPES)
    rank_at_least("LRN", types, 0, 2)
    size = attrs.get("size")
    if not isinstance(size, int) or size < 1:
        fail("LRN", f"attribute size={size!r}, expected a positive integer")
    return [types[0]]


def _lrn_ref(inputs, attrs):
    x = inputs[0]
    size = int(attrs["size"])
    channels = x.shape[1]
    w = x.astype(np.float64)
    squares = np.zeros_like(w)
    for c in range(channels):
        lo = max(0, c - (size - 1) // 2)
        hi = min(channels, c + (size - 1) - (size - 1) // 2 + 1)
        squares[:, c] = np.sum(np.square(w[:, lo:hi]), axis=1)
    alpha, beta, bias = attrs.get("alpha", 1e-4), attrs.get("beta", 0.75), attrs.get("bias", 1.0)
    return [(w / np.power(bias + alpha / size * squares, beta)).astype(x.dtype)]


define("GroupNormalization", OpKind.REDUCE, _groupnorm_infer, _groupnorm_ref)
define("MeanVarianceNormalization", OpKind.REDUCE, _mvn_infer, _mvn_ref)
define("Hardmax", OpKind.REDUCE, _hardmax_infer, _hardmax_ref)
define("LRN", OpKind.INJECTIVE, _lrn_infer, _lrn_ref)
