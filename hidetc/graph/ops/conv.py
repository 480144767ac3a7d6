"""Windowed ops: Conv (ANCHOR), MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool
(REDUCE), over any number of spatial dims (layout N, C, spatial...).

Assumes ONNX attributes: kernel_shape, strides, dilations, pads ([begin..., end...]),
auto_pad NOTSET/VALID/SAME_UPPER/SAME_LOWER, group (Conv), ceil_mode and
count_include_pad (pools). MaxPool's optional Indices output is not supported.
Guarantees: `window_geometry` is the single source of output sizes and padding for both
`infer` and `reference`; Conv runs as im2col + matmul, pools on strided window views,
so the references are fast enough for whole real models.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from hidetc.graph.ir import FLOAT_DTYPES, TensorType
from hidetc.graph.ops.common import (
    arity,
    attr_ints,
    bf16_operands,
    dtype_in,
    fail,
    fmt,
    present,
    rank_at_least,
    rank_is,
    same_dtype,
)
from hidetc.graph.ops.registry import OpKind, define

POOL_DTYPES = FLOAT_DTYPES + ("int8", "uint8")


@dataclass(frozen=True)
class Window:
    """Resolved window geometry; `extra` is ceil-mode overrun padded past `end`."""
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]
    extra: tuple[int, ...]
    out: tuple[int, ...]


def _per_dim(op: str, attrs: dict, key: str, dims: int, default: int) -> tuple[int, ...]:
    values = attr_ints(attrs, key, [default] * dims)
    if len(values) != dims:
        fail(op, f"attribute {key}={values} has {len(values)} entries, expected {dims}")
    if any(v < 1 for v in values):
        fail(op, f"attribute {key}={values} must be positive")
    return tuple(values)


def _auto_pads(mode: str, sizes, kernel, strides, dilations) -> tuple[list[int], list[int]]:
    begin, end = [], []
    for size, k, s, d in zip(sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(small if mode == "SAME_UPPER" else big)
        end.append(big if mode == "SAME_UPPER" else small)
    return begin, end


def _explicit_pads(op: str, attrs: dict, dims: int) -> tuple[list[int], list[int]]:
    pads = attr_ints(attrs, "pads", [0] * (2 * dims))
    if len(pads) != 2 * dims or any(p < 0 for p in pads):
        fail(op, f"attribute pads={pads} must have {2 * dims} non-negative entries")
    return pads[:dims], pads[dims:]


def window_geometry(op: str, sizes: tuple[int, ...], kernel: tuple[int, ...], attrs: dict,
                    ceil_mode: bool = False) -> Window:
    dims = len(sizes)
    strides = _per_dim(op, attrs, "strides", dims, 1)
    dilations = _per_dim(op, attrs, "dilations", dims, 1)
    mode = attrs.get("auto_pad", "NOTSET")
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = _auto_pads(mode, sizes, kernel, strides, dilations)
    elif mode == "VALID":
        begin, end = [0] * dims, [0] * dims
    elif mode == "NOTSET":
        begin, end = _explicit_pads(op, attrs, dims)
    else:
        fail(op, f"attribute auto_pad={mode!r} is not one of NOTSET, VALID, SAME_UPPER, "
                 f"SAME_LOWER")
    out, extra = [], []
    ceil_mode = ceil_mode and mode == "NOTSET"
    for i, (size, k, s, d) in enumerate(zip(sizes, kernel, strides, dilations)):
        span = (k - 1) * d + 1
        padded = size + begin[i] + end[i]
        # ONNX: ceil((padded - span) / s) + 1 under ceil_mode, floor otherwise; the
        # difference may be negative under ceil_mode (a kernel larger than the padded
        # input, an exported global pool): one window, cut to the input, as ONNX Runtime
        # and PyTorch give
        n = (-(-(padded - span) // s) if ceil_mode else (padded - span) // s) + 1
        if ceil_mode and n > 1 and (n - 1) * s >= size + begin[i]:
            n -= 1
        if n < 1:
            fail(op, f"input 0 spatial dim {i} is {size} (padded {padded}), smaller than the "
                     f"dilated kernel {span}" + ("" if ceil_mode else " (no ceil_mode)"))
        out.append(n)
        extra.append(max(0, (n - 1) * s + span - padded))
    return Window(kernel, strides, dilations, tuple(begin), tuple(end), tuple(extra), tuple(out))


def windows(xp: np.ndarray, win: Window) -> np.ndarray:
    """View of shape (N, C, *out, *kernel) over an input already padded for `win`."""
    dims = len(win.kernel)
    spans = tuple((k - 1) * d + 1 for k, d in zip(win.kernel, win.dilations))
    view = sliding_window_view(xp, spans, axis=tuple(range(2, 2 + dims)))
    index = (slice(None), slice(None))
    index += tuple(slice(0, (n - 1) * s + 1, s) for n, s in zip(win.out, win.strides))
    index += tuple(slice(None, None, d) for d in win.dilations)
    return view[index]


def _pad(x: np.ndarray, win: Window, value) -> np.ndarray:
    widths = [(0, 0), (0, 0)] + [(b, e + x_) for b, e, x_ in zip(win.begin, win.end, win.extra)]
    if not any(b or e for b, e in widths):
        return x
    return np.pad(x, widths, mode="constant", constant_values=value)


def _kernel_attr(op: str, attrs: dict, dims: int, default=None) -> tuple[int, ...]:
    kernel = attr_ints(attrs, "kernel_shape", default)
    if kernel is None:
        fail(op, "attribute kernel_shape is required")
    if len(kernel) != dims or any(k < 1 for k in kernel):
        fail(op, f"attribute kernel_shape={kernel} must have {dims} positive entries")
    return tuple(kernel)


def _conv_infer(types, attrs, values):
    arity("Conv", types, 2, 3)
    dtype = dtype_in("Conv", types, 0, FLOAT_DTYPES)
    same_dtype("Conv", types, [0, 1, 2] if present(types, 2) else [0, 1])
    rank_at_least("Conv", types, 0, 3)
    x, w = types[0].shape, types[1].shape
    rank_is("Conv", types, 1, (len(x),))
    group = attrs.get("group", 1)
    if group < 1 or x[1] % group or w[0] % group or w[1] * group != x[1]:
        fail("Conv", f"input 1 has shape {fmt(w)}: with group={group} expected dim 1 to be "
                     f"{x[1] // max(group, 1)} (channels {x[1]} / group) and dim 0 a multiple "
                     f"of {group}")
    kernel = _kernel_attr("Conv", attrs, len(x) - 2, list(w[2:]))
    if kernel != w[2:]:
        fail("Conv", f"attribute kernel_shape={list(kernel)} does not match input 1 shape {fmt(w)}")
    if present(types, 2) and types[2].shape != (w[0],):
        fail("Conv", f"input 2 has shape {fmt(types[2].shape)}, expected [{w[0]}]")
    win = window_geometry("Conv", x[2:], kernel, attrs)
    return [TensorType(dtype, (x[0], w[0]) + win.out)]


def _conv_ref(inputs, attrs):
    x, w = bf16_operands(inputs[:2], attrs)
    bias = inputs[2] if len(inputs) > 2 else None
    work = np.float32 if x.dtype != np.float64 else np.float64
    n, c = x.shape[:2]
    m, group = w.shape[0], attrs.get("group", 1)
    win = window_geometry("Conv", x.shape[2:], w.shape[2:], attrs)
    dims, positions = len(win.out), math.prod(win.out)
    view = windows(_pad(x.astype(work, copy=False), win, 0), win)
    view = view.reshape((n, group, c // group) + win.out + win.kernel)
    order = (0, 1) + tuple(range(3, 3 + dims)) + (2,) + tuple(range(3 + dims, 3 + 2 * dims))
    cols = np.ascontiguousarray(view.transpose(order)).reshape(n, group, positions, -1)
    weights = w.astype(work).reshape(group, m // group, -1).transpose(0, 2, 1)
    y = np.matmul(cols, weights)                                  # n, group, positions, m/g
    y = y.transpose(0, 1, 3, 2).reshape((n, m) + win.out)
    if bias is not None:
        y = y + bias.astype(work).reshape((1, m) + (1,) * dims)
    return [y.astype(x.dtype)]


def _pool_infer(name: str):
    def infer(types, attrs, values):
        arity(name, types, 1)
        dtype = dtype_in(name, types, 0, POOL_DTYPES if name == "MaxPool" else FLOAT_DTYPES)
        rank_at_least(name, types, 0, 3)
        shape = types[0].shape
        kernel = _kernel_attr(name, attrs, len(shape) - 2)
        win = window_geometry(name, shape[2:], kernel, attrs, bool(attrs.get("ceil_mode", 0)))
        return [TensorType(dtype, shape[:2] + win.out)]
    return infer


def _pool_geometry(name: str, x: np.ndarray, attrs: dict) -> Window:
    kernel = tuple(attrs["kernel_shape"])
    return window_geometry(name, x.shape[2:], kernel, attrs, bool(attrs.get("ceil_mode", 0)))


def _maxpool_ref(inputs, attrs):
    x = inputs[0]
    win = _pool_geometry("MaxPool", x, attrs)
    floating = x.dtype.kind == "f" or x.dtype.name == "bfloat16"   # ml_dtypes' kind is "V"
    low = -np.inf if floating else np.iinfo(x.dtype).min
    view = windows(_pad(x, win, low), win)
    dims = len(win.out)
    return [np.max(view, axis=tuple(range(-dims, 0))).astype(x.dtype)]


def _avgpool_ref(inputs, attrs):
    x = inputs[0]
    win = _pool_geometry("AveragePool", x, attrs)
    dims = len(win.out)
    axes = tuple(range(-dims, 0))
    total = np.sum(windows(_pad(x.astype(np.float64), win, 0.0), win), axis=axes)
    mask = np.ones((1, 1) + x.shape[2:], dtype=np.float64)
    if attrs.get("count_include_pad", 0):
        mask = np.pad(mask, [(0, 0), (0, 0)] + list(zip(win.begin, win.end)), constant_values=1)
        inner = Window(win.kernel, win.strides, win.dilations, (0,) * dims, (0,) * dims,
                       win.extra, win.out)
        count = np.sum(windows(_pad(mask, inner, 0.0), inner), axis=axes)
    else:
        count = np.sum(windows(_pad(mask, win, 0.0), win), axis=axes)
    return [(total / count).astype(x.dtype)]


def _global_infer(name: str):
    def infer(types, attrs, values):
        arity(name, types, 1)
        dtype = dtype_in(name, types, 0, FLOAT_DTYPES)
        rank_at_least(name, types, 0, 3)
        shape = types[0].shape
        return [TensorType(dtype, shape[:2] + (1,) * (len(shape) - 2))]
    return infer


def _global_ref(fn):
    def reference(inputs, attrs):
        x = inputs[0]
        axes = tuple(range(2, x.ndim))
        return [np.asarray(fn(x.astype(np.float64), axis=axes, keepdims=True)).astype(x.dtype)]
    return reference


define("Conv", OpKind.ANCHOR, _conv_infer, _conv_ref)
define("MaxPool", OpKind.REDUCE, _pool_infer("MaxPool"), _maxpool_ref)
define("AveragePool", OpKind.REDUCE, _pool_infer("AveragePool"), _avgpool_ref)
define("GlobalAveragePool", OpKind.REDUCE, _global_infer("GlobalAveragePool"),
       _global_ref(np.mean))
define("GlobalMaxPool", OpKind.REDUCE, _global_infer("GlobalMaxPool"), _global_ref(np.max))
