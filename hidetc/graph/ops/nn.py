"""Neural-network ops other than windowed ones: MatMul, Gemm (ANCHOR), Softmax,
LogSoftmax, LayerNormalization, InstanceNormalization (REDUCE), BatchNormalization
(inference only, BIJECTIVE: a per-channel affine map of x, read at the element's
channel; graph passes fold it into a Conv or into Mul + Add when its parameters are
constants, and otherwise it runs as its elementwise compute definition).

Assumes opset-13+ semantics: Softmax/LogSoftmax normalize along ONE axis (default -1).
LayerNormalization produces only its first output (Y); Mean/InvStdDev are not supported
(`infer` returns one type, so `infer_node` rejects nodes that use the others).
BatchNormalization with training_mode=1 is rejected. Guarantees: normalizations compute
in float64 and round back; MatMul/Gemm compute in the input dtype (float16 in float32)
with numpy matmul semantics (1-D promotion, batch broadcasting).
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ShapeError
from hidetc.graph.ir import FLOAT_DTYPES, TensorType
from hidetc.graph.ops.common import (
    NUMERIC,
    arity,
    bf16_operands,
    broadcast,
    compute_dtype,
    dtype_in,
    fail,
    fmt,
    norm_axis,
    present,
    rank_at_least,
    rank_is,
    same_dtype,
    unidirectional,
)
from hidetc.graph.ops.registry import OpKind, define


def matmul_shape(op: str, a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """Output shape of numpy matmul on shapes a and b (raises ShapeError)."""
    if not a or not b:
        fail(op, f"input {0 if not a else 1} is a scalar, expected rank >= 1")
    a2 = a if len(a) >= 2 else (1,) + a
    b2 = b if len(b) >= 2 else b + (1,)
    if a2[-1] != b2[-2]:
        fail(op, f"input 1 has shape {fmt(b)}: its dim {len(b2) - 2} is {b2[-2]}, expected "
                 f"{a2[-1]} (last dim of input 0 {fmt(a)})")
    try:
        batch = broadcast(op, [a2[:-2], b2[:-2]])
    except ShapeError:
        fail(op, f"input 1 has shape {fmt(b)}: batch dims not broadcastable with input 0 "
                 f"{fmt(a)}")
    out = batch + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _matmul_infer(types, attrs, values):
    arity("MatMul", types, 2)
    dtype = dtype_in("MatMul", types, 0, NUMERIC)
    same_dtype("MatMul", types, [0, 1])
    return [TensorType(dtype, matmul_shape("MatMul", types[0].shape, types[1].shape))]


def _matmul_ref(inputs, attrs):
    a, b = bf16_operands(inputs, attrs)
    work = compute_dtype(a.dtype)
    return [np.matmul(a.astype(work, copy=False), b.astype(work, copy=False)).astype(a.dtype)]


def _gemm_infer(types, attrs, values):
    arity("Gemm", types, 2, 3)
    dtype = dtype_in("Gemm", types, 0, NUMERIC)
    same_dtype("Gemm", types, [0, 1, 2] if present(types, 2) else [0, 1])
    rank_is("Gemm", types, 0, (2,))
    rank_is("Gemm", types, 1, (2,))
    m, k = types[0].shape[::-1] if attrs.get("transA", 0) else types[0].shape
    k2, n = types[1].shape[::-1] if attrs.get("transB", 0) else types[1].shape
    if k != k2:
        fail("Gemm", f"input 1 has shape {fmt(types[1].shape)} (transB={attrs.get('transB', 0)})"
                     f": inner dim {k2} does not match {k} of input 0 {fmt(types[0].shape)} "
                     f"(transA={attrs.get('transA', 0)})")
    if present(types, 2):
        unidirectional("Gemm", (m, n), types[2].shape, 2)
    return [TensorType(dtype, (m, n))]


def _gemm_ref(inputs, attrs):
    a, b = inputs[0], inputs[1]
    c = inputs[2] if len(inputs) > 2 else None
    work = compute_dtype(a.dtype)
    a = a.T if attrs.get("transA", 0) else a
    b = b.T if attrs.get("transB", 0) else b
    y = np.matmul(a.astype(work), b.astype(work))
    alpha, beta = attrs.get("alpha", 1.0), attrs.get("beta", 1.0)
    if alpha != 1.0:
        y = y * work.type(alpha)
    if c is not None and beta != 0.0:
        y = y + work.type(beta) * c.astype(work)
    return [np.asarray(y).astype(inputs[0].dtype)]


def _softmax_infer(name: str):
    def infer(types, attrs, values):
        arity(name, types, 1)
        dtype_in(name, types, 0, FLOAT_DTYPES)
        norm_axis(name, attrs.get("axis", -1), max(types[0].rank, 1))
        return [types[0]]
    return infer


def _softmax_ref(log: bool):
    def reference(inputs, attrs):
        x = inputs[0]
        axis = attrs.get("axis", -1)
        if x.ndim == 0:
            return [np.zeros_like(x) if log else np.ones_like(x)]
        w = x.astype(np.float64)
        shifted = w - np.max(w, axis=axis, keepdims=True)
        total = np.sum(np.exp(shifted), axis=axis, keepdims=True)
        y = shifted - np.log(total) if log else np.exp(shifted) / total
        return [y.astype(x.dtype)]
    return reference


def _layernorm_infer(types, attrs, values):
    arity("LayerNormalization", types, 2, 3)
    dtype = dtype_in("LayerNormalization", types, 0, FLOAT_DTYPES)
    same_dtype("LayerNormalization", types, [0, 1, 2] if present(types, 2) else [0, 1])
    rank_at_least("LayerNormalization", types, 0, 1)
    axis = norm_axis("LayerNormalization", attrs.get("axis", -1), types[0].rank)
    normalized = types[0].shape[axis:]
    for i in (1, 2):
        if present(types, i):
            unidirectional("LayerNormalization", normalized, types[i].shape, i)
    return [TensorType(dtype, types[0].shape)]


def _layernorm_ref(inputs, attrs):
    x, scale = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    axis = attrs.get("axis", -1) % x.ndim
    axes = tuple(range(axis, x.ndim))
    w = x.astype(np.float64)
    mean = np.mean(w, axis=axes, keepdims=True)
    var = np.mean(np.square(w - mean), axis=axes, keepdims=True)
    y = (w - mean) / np.sqrt(var + attrs.get("epsilon", 1e-5)) * scale.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    return [y.astype(x.dtype)]


def _channel_params(op: str, types, first: int, last: int) -> None:
    channels = types[0].shape[1]
    for i in range(first, last + 1):
        if types[i].shape != (channels,):
            fail(op, f"input {i} has shape {fmt(types[i].shape)}, expected [{channels}] "
                     f"(channels of input 0 {fmt(types[0].shape)})")


def _instancenorm_infer(types, attrs, values):
    arity("InstanceNormalization", types, 3)
    dtype = dtype_in("InstanceNormalization", types, 0, FLOAT_DTYPES)
    same_dtype("InstanceNormalization", types, [0, 1, 2])
    rank_at_least("InstanceNormalization", types, 0, 3)
    _channel_params("InstanceNormalization", types, 1, 2)
    return [TensorType(dtype, types[0].shape)]


def _instancenorm_ref(inputs, attrs):
    x, scale, bias = inputs
    axes = tuple(range(2, x.ndim))
    bshape = (1, -1) + (1,) * (x.ndim - 2)
    w = x.astype(np.float64)
    mean = np.mean(w, axis=axes, keepdims=True)
    var = np.mean(np.square(w - mean), axis=axes, keepdims=True)
    y = (w - mean) / np.sqrt(var + attrs.get("epsilon", 1e-5))
    y = y * scale.astype(np.float64).reshape(bshape) + bias.astype(np.float64).reshape(bshape)
    return [y.astype(x.dtype)]


def _batchnorm_infer(types, attrs, values):
    arity("BatchNormalization", types, 5)
    if attrs.get("training_mode", 0):
        fail("BatchNormalization", "training_mode=1 is not supported (inference only)")
    dtype = dtype_in("BatchNormalization", types, 0, FLOAT_DTYPES)
    for i in range(1, 5):
        dtype_in("BatchNormalization", types, i, FLOAT_DTYPES)
    rank_at_least("BatchNormalization", types, 0, 2)
    _channel_params("BatchNormalization", types, 1, 4)
    return [TensorType(dtype, types[0].shape)]


def _batchnorm_ref(inputs, attrs):
    x, scale, bias, mean, var = inputs
    shape = (1, -1) + (1,) * (x.ndim - 2)
    param = [p.astype(np.float64).reshape(shape) for p in (scale, bias, mean, var)]
    scale64, bias64, mean64, var64 = param
    y = (x.astype(np.float64) - mean64) / np.sqrt(var64 + attrs.get("epsilon", 1e-5))
    return [(y * scale64 + bias64).astype(x.dtype)]


define("MatMul", OpKind.ANCHOR, _matmul_infer, _matmul_ref)
define("Gemm", OpKind.ANCHOR, _gemm_infer, _gemm_ref)
define("Softmax", OpKind.REDUCE, _softmax_infer("Softmax"), _softmax_ref(False))
define("LogSoftmax", OpKind.REDUCE, _softmax_infer("LogSoftmax"), _softmax_ref(True))
define("LayerNormalization", OpKind.REDUCE, _layernorm_infer, _layernorm_ref)
define("InstanceNormalization", OpKind.REDUCE, _instancenorm_infer, _instancenorm_ref)
define("BatchNormalization", OpKind.BIJECTIVE, _batchnorm_infer, _batchnorm_ref)
