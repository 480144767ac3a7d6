"""Convolution and pooling beyond 2-D NCHW, read as decompositions onto the 2-D
catalogue ops (whose CPU and CUDA kernels are tuned): Conv, MaxPool (with Indices),
AveragePool, LpPool, CenterCropPad (ConvTranspose and Col2Im: `transposed_conv.py`).

Assumes: static shapes (`ctx.types`); CenterCropPad's `shape` input (`VALUE_INPUTS`)
is known at import time
(`ctx.values`). The window geometry (auto_pad, ceil_mode, output sizes) is resolved by
the catalogue's `window_geometry`: every node built here has explicit pads only.
Guarantees:
  - a 2-D Conv/MaxPool/AveragePool node (rank 4; MaxPool without a read Indices output)
    is emitted unchanged; any other rank than 3..5, or inputs the decomposition cannot
    read (kernel/group mismatch...), are emitted too, so the catalogue's checks report
    them in one line;
  - 1-D (rank 3): Reshape to [N, C, 1, W] (weights too), the 2-D op, Reshape back;
  - 3-D Conv: Pad depth, then per kernel depth tap kd a 2-D Conv of the input depth
    slices at od*sD + kd*dD (folded into the batch) with W[:, :, kd], summed (bias once);
  - 3-D pools, separably: a 2-D pool over (H, W) on [N, C*D, H, W], then a (kD, 1) pool
    over D on [N, C, D, H'*W']. Exact for max; for average without count_include_pad the
    divisor (valid taps) is a product of per-dimension counts; with count_include_pad
    the input is first zero-padded explicitly and pooled without it (the ceil_mode
    overrun past the end pads is never counted, as ONNX's kernels do);
  - MaxPool Indices (flat over N, C and the spatial dims; storage_order 1 reads the
    spatial dims column-major): per window tap, in reverse order, Where(slice of the
    -inf padded input == Y, that tap's index constant, ...), so the first maximal tap
    in row-major window order wins, as onnx's reference does;
  - LpPool-2..22: (sum over the zero-padded window of |x|^p)^(1/p) (the test data's
    definition), the sum being an AveragePool of the padded input times the tap count;
    p = 1 and 2 use Abs and Mul/Sqrt;
  - CenterCropPad-18: Slice for the crops and Pad with zeros for the pads, the smaller
    half in front (onnx's reference).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np

from hidetc.errors import ModelError, ShapeError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, emit, label, scalar
from hidetc.graph.ops.conv import Window, window_geometry
from hidetc.graph.symbolic import shape_array

INT64_MIN = int(np.iinfo(np.int64).min)
Shape = tuple[int, ...]


def _i64(values) -> np.ndarray:
    return shape_array(values)


def _sliced(size: int, start: int, end: int, step: int) -> int:
    return len(range(*slice(start, end, step).indices(size)))


class _Build(Builder):
    """A Builder that knows the static shape of every value it makes."""

    def __init__(self, node: OnnxNode, ctx: Context):
        super().__init__(node, ctx)
        self.shape: dict[str, Shape] = {n: ctx.types[n].shape for n in node.inputs if n}
        self.dtype = ctx.types[node.inputs[0]].dtype

    def op(self, op: str, inputs, shape: Shape, **attrs) -> str:
        name = self.add(op, inputs, **attrs)
        self.shape[name] = tuple(shape)
        return name

    def constant(self, what: str, array: np.ndarray) -> str:
        name = self.const(what, array)
        self.shape[name] = array.shape
        return name

    def finish(self, value: str, out: str) -> str:
        """Make `value` the ONNX output `out` (renaming the node that made it)."""
        last = self.nodes[-1] if self.nodes else None
        if last is not None and last.outputs == (value,):
            self.nodes[-1] = replace(last, outputs=(out,), name=self.node.name)
        else:
            self.add("Identity", [value], out=out)
        self.shape[out] = self.shape[value]
        return out

    def reshape(self, x: str, shape: Shape) -> str:
        if tuple(shape) == self.shape[x]:
            return x
        return self.op("Reshape", [x, self.const("shape", _i64(shape))], shape)

    def transpose(self, x: str, perm) -> str:
        if tuple(perm) == tuple(range(len(perm))):
            return x
        return self.op("Transpose", [x], tuple(self.shape[x][p] for p in perm), perm=tuple(perm))

    def slice(self, x: str, axes, starts, ends, steps) -> str:
        shape = list(self.shape[x])
        for a, st, en, sp in zip(axes, starts, ends, steps):
            shape[a] = _sliced(shape[a], st, en, sp)
        if tuple(shape) == self.shape[x] and all(s == 1 for s in steps):
            return x
        inputs = [x] + [self.const(w, _i64(v)) for w, v in
                        (("starts", starts), ("ends", ends), ("axes", axes), ("steps", steps))]
        return self.op("Slice", inputs, shape)

    def pad(self, x: str, begin, end, value: float = 0.0) -> str:
        """Pad every axis by (begin[i], end[i]) with `value`; negative entries crop."""
        shape = self.shape[x]
        cut = [i for i in range(len(shape)) if begin[i] < 0 or end[i] < 0]
        if cut:
            x = self.slice(x, cut, [max(0, -begin[i]) for i in cut],
                           [shape[i] - max(0, -end[i]) for i in cut], [1] * len(cut))
        grow = [max(0, v) for v in begin] + [max(0, v) for v in end]
        if not any(grow):
            return x
        rank = len(shape)
        out = tuple(d + grow[i] + grow[rank + i] for i, d in enumerate(self.shape[x]))
        return self.op("Pad", [x, self.const("pads", _i64(grow)),
                               self.const("value", scalar(value, self.dtype))], out)


def _geometry(node: OnnxNode, sizes: Shape, kernel, ceil: bool = False) -> Window:
    try:
        return window_geometry(node.op, tuple(sizes), tuple(kernel), dict(node.attrs), ceil)
    except ShapeError as error:
        raise ModelError(f"{label(node)}: {str(error).split(': ', 1)[-1]}") from None


def _window(kernel, strides, dilations, begin, end, extra, out) -> Window:
    return Window(*(tuple(int(v) for v in t) for t in
                    (kernel, strides, dilations, begin, end, extra, out)))


def _lift(win: Window) -> Window:
    """The 1-D window as a 2-D one over [1, W]."""
    return _window((1,) + win.kernel, (1,) + win.strides, (1,) + win.dilations,
                   (0,) + win.begin, (0,) + win.end, (0,) + win.extra, (1,) + win.out)


def _tail(win: Window) -> Window:
    """The last two dims of a 3-D window."""
    return _window(*(t[1:] for t in (win.kernel, win.strides, win.dilations, win.begin,
                                     win.end, win.extra, win.out)))


# ---------------------------------------------------------------- convolution

def _conv(b: _Build, x: str, w: str, bias: str, win: Window, group: int) -> str:
    """Conv of rank 3..5 `x` with `w` over `win` (explicit pads, no ceil overrun)."""
    xs, ws = b.shape[x], b.shape[w]
    n, m, dims = xs[0], ws[0], len(xs) - 2
    if dims == 2:
        return b.op("Conv", [x, w] + ([bias] if bias else []), (n, m) + win.out,
                    strides=win.strides, dilations=win.dilations, group=group,
                    pads=win.begin + win.end)
    if dims == 1:
        y = _conv(b, b.reshape(x, xs[:2] + (1,) + xs[2:]),
                  b.reshape(w, ws[:2] + (1,) + ws[2:]), bias, _lift(win), group)
        return b.reshape(y, (n, m) + win.out)
    xp = b.pad(x, (0, 0, win.begin[0], 0, 0), (0, 0, win.end[0], 0, 0))
    od, stride, dilation = win.out[0], win.strides[0], win.dilations[0]
    plane = _tail(win)
    total = None
    for kd in range(ws[2]):
        start = kd * dilation
        taps = b.slice(xp, [2], [start], [start + (od - 1) * stride + 1], [stride])
        moved = b.transpose(taps, (0, 2, 1, 3, 4))
        flat = b.reshape(moved, (n * od, xs[1]) + xs[3:])
        wk = b.reshape(b.slice(w, [2], [kd], [kd + 1], [1]), ws[:2] + ws[3:])
        y = _conv(b, flat, wk, bias if total is None else "", plane, group)
        total = y if total is None else b.op("Add", [total, y], b.shape[y])
    return b.transpose(b.reshape(total, (n, od, m) + win.out[1:]), (0, 2, 1, 3, 4))


def conv(node: OnnxNode, ctx: Context) -> Converted:
    x, w = ctx.types[node.inputs[0]], ctx.types[node.inputs[1]]
    group = int(node.attrs.get("group", 1))
    kernel = tuple(node.attrs.get("kernel_shape", w.shape[2:]))
    readable = (x.rank in (3, 5) and w.rank == x.rank and kernel == w.shape[2:]
                and group >= 1 and x.shape[1] == w.shape[1] * group and w.shape[0] % group == 0)
    if not readable:
        return emit(node, ctx)   # 2-D, or the catalogue's Conv reports what is wrong
    win = _geometry(node, x.shape[2:], kernel)
    b = _Build(node, ctx)
    y = _conv(b, node.inputs[0], node.inputs[1], node.input(2), win, group)
    b.finish(y, node.outputs[0])
    return b.done()


# ---------------------------------------------------------------- pooling

def _pool2d(b: _Build, op: str, x: str, win: Window) -> str:
    xs = b.shape[x]
    extra = {"count_include_pad": 0} if op == "AveragePool" else {}
    ends = tuple(e + x_ for e, x_ in zip(win.end, win.extra))
    return b.op(op, [x], xs[:2] + win.out, kernel_shape=win.kernel, strides=win.strides,
                dilations=win.dilations, pads=win.begin + ends, **extra)


def _pool(b: _Build, op: str, x: str, win: Window) -> str:
    """MaxPool, or AveragePool over the in-bounds taps, of rank 3..5 `x`."""
    xs = b.shape[x]
    dims = len(xs) - 2
    if dims == 2:
        return _pool2d(b, op, x, win)
    if dims == 1:
        y = _pool2d(b, op, b.reshape(x, xs[:2] + (1,) + xs[2:]), _lift(win))
        return b.reshape(y, xs[:2] + win.out)
    n, c, d = xs[:3]
    plane = _tail(win)
    hw = _pool2d(b, op, b.reshape(x, (n, c * d) + xs[3:]), plane)
    area = math.prod(plane.out)
    depth = _window((win.kernel[0], 1), (win.strides[0], 1), (win.dilations[0], 1),
                    (win.begin[0], 0), (win.end[0], 0), (win.extra[0], 0), (win.out[0], area))
    y = _pool2d(b, op, b.reshape(hw, (n, c, d, area)), depth)
    return b.reshape(y, (n, c) + win.out)


def _zero_padded(b: _Build, x: str, win: Window) -> tuple[str, Window]:
    """`x` padded with zeros by the window's pads, and the window over it."""
    xp = b.pad(x, (0, 0) + win.begin, (0, 0) + win.end)
    zeros = (0,) * len(win.kernel)
    return xp, replace(win, begin=zeros, end=zeros)


def _pool_window(node: OnnxNode, ctx: Context) -> Window | None:
    x = ctx.types[node.inputs[0]]
    kernel = node.attrs.get("kernel_shape")
    if kernel is None or len(kernel) != x.rank - 2:
        return None
    return _geometry(node, x.shape[2:], kernel, bool(node.attrs.get("ceil_mode", 0)))


def _reads_indices(node: OnnxNode, ctx: Context) -> bool:
    return node.op == "MaxPool" and len(node.outputs) > 1 and node.outputs[1] in ctx.used


def pool(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    if x.rank not in (3, 4, 5) or (x.rank == 4 and not _reads_indices(node, ctx)):
        return emit(node, ctx)
    win = _pool_window(node, ctx)
    if win is None:
        return emit(node, ctx)   # the catalogue reports the kernel_shape
    b = _Build(node, ctx)
    source = node.inputs[0]
    if node.op == "AveragePool" and node.attrs.get("count_include_pad", 0):
        source, win = _zero_padded(b, source, win)
    y = b.finish(_pool(b, node.op, source, win), node.outputs[0])
    if _reads_indices(node, ctx):
        order = int(node.attrs.get("storage_order", 0))
        b.finish(_indices(b, node.inputs[0], y, win, order), node.outputs[1])
    return b.done()


def _flat_index(shape: Shape, column_major: bool) -> np.ndarray:
    """Each element's flat index over [N, C, spatial...] (spatial column-major if asked)."""
    n, c, spatial = shape[0], shape[1], shape[2:]
    grids = np.meshgrid(*[np.arange(s) for s in spatial], indexing="ij")
    dims = range(len(spatial))
    order = dims if column_major else reversed(dims)
    index, step = np.zeros(spatial, dtype=np.int64), 1
    for i in order:
        index, step = index + grids[i] * step, step * spatial[i]
    planes = np.arange(n * c, dtype=np.int64).reshape(n, c, *(1,) * len(spatial))
    return planes * step + index


def _indices(b: _Build, x: str, y: str, win: Window, column_major: bool) -> str:
    xs = b.shape[x]
    low = -np.inf if np.dtype(b.dtype).kind == "f" else np.iinfo(np.dtype(b.dtype)).min
    ends = tuple(e + x_ for e, x_ in zip(win.end, win.extra))
    xp = b.pad(x, (0, 0) + win.begin, (0, 0) + ends, low)
    index = np.pad(_flat_index(xs, column_major),
                   [(0, 0), (0, 0)] + list(zip(win.begin, ends)), constant_values=-1)
    axes = list(range(2, len(xs)))
    found = None
    for tap in reversed(list(itertools.product(*(range(k) for k in win.kernel)))):
        starts = [t * d for t, d in zip(tap, win.dilations)]
        stops = [s + (o - 1) * st + 1 for s, o, st in zip(starts, win.out, win.strides)]
        picks = (slice(None), slice(None)) + tuple(
            slice(s, e, st) for s, e, st in zip(starts, stops, win.strides))
        tap_index = b.constant("index", index[picks])
        if found is None:
            found = tap_index
            continue
        hit = b.op("Equal", [b.slice(xp, axes, starts, stops, list(win.strides)), y],
                   b.shape[y])
        found = b.op("Where", [hit, tap_index, found], b.shape[y])
    return found


def _tap_counts(win: Window, padded: Shape) -> np.ndarray | float:
    """Taps of each window inside the (explicitly padded) input: prod(kernel) unless
    ceil_mode's overrun cuts the last windows."""
    if not any(win.extra):
        return float(math.prod(win.kernel))
    counts = np.ones((1, 1), dtype=np.float64)
    for k, s, d, o, size in zip(win.kernel, win.strides, win.dilations, win.out, padded):
        per = np.array([sum(1 for t in range(k) if i * s + t * d < size) for i in range(o)])
        counts = np.multiply.outer(counts, per)
    return counts


def lp_pool(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    if x.rank not in (3, 4, 5):
        raise ModelError(f"{label(node)}: input 0 has rank {x.rank}, expected 3, 4 or 5 "
                         f"(N, C and 1 to 3 spatial dims)")
    win = _pool_window(node, ctx)
    if win is None:
        raise ModelError(f"{label(node)}: attribute kernel_shape="
                         f"{node.attrs.get('kernel_shape')} must have {x.rank - 2} entries")
    p = int(node.attrs.get("p", 2))
    if p < 1:
        raise ModelError(f"{label(node)}: attribute p={p} must be at least 1")
    b = _Build(node, ctx)
    magnitude = b.op("Abs", [node.inputs[0]], x.shape)
    if p == 2:
        magnitude = b.op("Mul", [magnitude, magnitude], x.shape)
    elif p > 2:
        magnitude = b.op("Pow", [magnitude, b.const("p", scalar(p, x.dtype))], x.shape)
    padded, win = _zero_padded(b, magnitude, win)
    mean = _pool(b, "AveragePool", padded, win)
    counts = _tap_counts(win, b.shape[padded][2:])
    total = b.op("Mul", [mean, b.const("taps", np.asarray(counts).astype(x.dtype))],
                 b.shape[mean])
    if p == 2:
        total = b.op("Sqrt", [total], b.shape[total])
    elif p > 2:
        total = b.op("Pow", [total, b.const("inverse_p", scalar(1.0 / p, x.dtype))],
                     b.shape[total])
    b.finish(total, node.outputs[0])
    return b.done()


# ---------------------------------------------------------------- transposed convolution

def _known(node: OnnxNode, ctx: Context, index: int, what: str) -> Shape:
    value = ctx.values.get(node.input(index))
    if value is None:
        raise ModelError(f"{label(node)}: input {index} ({what}) must be known at import "
                         f"time (a constant)")
    return tuple(int(v) for v in np.asarray(value).reshape(-1))


def center_crop_pad(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    shape = _known(node, ctx, 1, "shape")
    axes = [int(a) for a in node.attrs.get("axes", range(x.rank))]
    if len(axes) != len(shape) or any(not -x.rank <= a < x.rank for a in axes) \
            or len({a % x.rank for a in axes}) != len(axes) or min(shape, default=0) < 0:
        raise ModelError(f"{label(node)}: input 1 (shape) {list(shape)} must give one "
                         f"non-negative size per axis of {axes} (input rank {x.rank})")
    begin, end = [0] * x.rank, [0] * x.rank
    for axis, size in zip(axes, shape):
        grow = size - x.shape[axis % x.rank]
        begin[axis % x.rank] = grow // 2 if grow >= 0 else -(-grow // 2)
        end[axis % x.rank] = grow - begin[axis % x.rank]
    b = _Build(node, ctx)
    b.finish(b.pad(node.inputs[0], begin, end), node.outputs[0])
    return b.done()


HANDLERS = {
    "Conv": conv,
    "MaxPool": pool,
    "AveragePool": pool,
    "LpPool": lp_pool,
    "CenterCropPad": center_crop_pad,
}
EXTRA_OPS: tuple[str, ...] = ("LpPool", "CenterCropPad")
# LpPool-2 and -11 are alike, 18 adds ceil_mode and dilations, 22 bfloat16;
# CenterCropPad has one version (18).
# Inputs whose values the decompositions need at compile time (see onnx_backend).
VALUE_INPUTS: dict[str, tuple[int, ...]] = {"CenterCropPad": (1,)}
CHECKED: tuple[str, ...] = ("LpPool", "CenterCropPad")
FIRST_VERSION: dict[str, int] = {}
