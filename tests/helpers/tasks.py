"""Anchor tasks built from shapes for the schedule and tuner tests: MatMul,
MatMulInteger, Conv and its channels-last twin ConvNHWC (pads resolved as the layout
pass writes them)."""
from __future__ import annotations

import numpy as np

from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType, freeze_attr
from hidetc.graph.ops.registry import get_op
from hidetc.schedules.common.conv_geometry import conv_geometry


def matmul_task(a_shape, b_shape, dtype: str = "float32") -> Task:
    """A MatMul of `dtype` operands (numpy's shapes: batch broadcast, 1-D operands)."""
    out = np.matmul(np.zeros(a_shape, np.float32), np.zeros(b_shape, np.float32)).shape
    return Task("MatMul", (TensorType(dtype, a_shape), TensorType(dtype, b_shape)),
                (TensorType(dtype, out),), (), (None, None))


def matmul_integer_task(a_shape, b_shape, a_dt="uint8", b_dt="int8", az=False,
                        bz=None) -> Task:
    """MatMulInteger(A, B[, a_zero[, b_zero]]): `az` a per-tensor a_zero, `bz` b_zero's
    shape (() per tensor, (N,) per column), None for none."""
    types = [TensorType(a_dt, a_shape), TensorType(b_dt, b_shape)]
    if az or bz is not None:
        types.append(TensorType(a_dt, ()) if az else None)
    if bz is not None:
        types.append(TensorType(b_dt, bz))
    out = get_op("MatMulInteger").infer(types, {}, [None] * len(types))[0]
    return Task("MatMulInteger", tuple(types), (out,), (), (None,) * len(types))


def conv_task(x_shape, w_shape, bias: bool, **attrs) -> Task:
    types = [TensorType("float32", x_shape), TensorType("float32", w_shape)]
    if bias:
        types.append(TensorType("float32", (w_shape[0],)))
    out = get_op("Conv").infer(types, attrs, [None] * len(types))[0]
    frozen = tuple(sorted((k, freeze_attr(v)) for k, v in attrs.items()))
    return Task("Conv", tuple(types), (out,), frozen, (None,) * len(types))


def nhwc_task(x_shape, w_shape, bias: bool, **attrs) -> Task:
    """The ConvNHWC twin of `conv_task` (shapes given NCHW / OIHW, pads resolved)."""
    nchw = conv_task(x_shape, w_shape, bias, **attrs)
    geo = conv_geometry(nchw)
    oh, ow = nchw.outputs[0].shape[2:]
    hp = [geo.pads[0], geo.pads[1]]
    end = [max(0, (o - 1) * s + (k - 1) * d + 1 - n - p) for o, s, k, d, n, p in
           zip((oh, ow), geo.strides, (geo.kh, geo.kw), geo.dilations, (geo.h, geo.w), hp)]
    resolved = {"strides": list(geo.strides), "dilations": list(geo.dilations),
                "pads": hp + end, "group": geo.groups}
    n, c, h, w = x_shape
    o, i, kh, kw = w_shape
    types = [TensorType("float32", (n, h, w, c)), TensorType("float32", (o, kh, kw, i))]
    if bias:
        types.append(TensorType("float32", (o,)))
    out = get_op("ConvNHWC").infer(types, resolved, [None] * len(types))[0]
    assert out.shape == (n, oh, ow, o)
    frozen = tuple(sorted((k, freeze_attr(v)) for k, v in resolved.items()))
    return Task("ConvNHWC", tuple(types), (out,), frozen, (None,) * len(types))


def task_reference(task: Task, inputs: list[np.ndarray]) -> np.ndarray:
    """The task's output in float64: numpy's matmul, else the op's registered reference."""
    if task.op == "MatMul":
        return np.matmul(*[x.astype(np.float64) for x in inputs])
    return get_op(task.op).reference([x.astype(np.float64) for x in inputs],
                                     dict(task.attrs))[0]
