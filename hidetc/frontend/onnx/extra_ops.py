"""Ops read as decompositions into catalogue ops (or as constants), and the older forms
of two catalogue ops (TopK, CumProd) that need no more than a rename of the inputs.

Assumes: static shapes (`ctx.types`); the inputs named in `VALUE_INPUTS` are known at
import time (`ctx.values`: constants, or graph inputs the ONNX backend binds as
initializers before compiling). Guarantees: the decompositions compute what onnx's
reference implementation computes (onnx/reference/ops); a missing compile-time value or
a bad attribute is a one-line ModelError naming node, op and input.
  - Scatter-9/11 (deprecated): ScatterElements (same inputs, `axis`).
  - EyeLike-9/22: a constant (np.eye of the input's 2-D shape, diagonal `k`, `dtype` or
    the input's dtype); the input's values are never read.
  - HannWindow/HammingWindow/BlackmanWindow-17: a constant of `size` (input 0, known)
    elements, `periodic` (default 1: N = size, else N = size - 1), `output_datatype`
    (default float32); formulas of onnx's reference (Hamming alpha = 25/46).
  - MelWeightMatrix-17: a constant [dft_length // 2 + 1, num_mel_bins] (all five inputs
    known): num_mel_bins + 2 edges evenly spaced in mel (2595 log10(1 + f / 700)) from
    lower_edge_hertz by (mel(upper) - mel(lower)) / (num_mel_bins + 2) -- onnx's
    reference and ONNX Runtime divide by num_mel_bins + 2, not + 1 -- each mapped to the
    spectrogram bin floor((dft_length + 1) * hertz / sample_rate); mel bin i is the
    triangle rising from edge i to 1 at edge i + 1 and falling to edge i + 2. An edge
    past the last spectrogram bin (upper_edge_hertz above the Nyquist rate) or before
    the first is a ModelError.
  - Compress-9/11: Gather of the positions where the (known) condition is true along
    `axis` (the flattened input without it); a condition longer than the axis may only
    have false entries past it. A run-time condition gives a data-dependent shape and
    is refused.
  - ReverseSequence-10: GatherElements along time_axis with index
    Where(t < L_b, L_b - 1 - t, t), L_b = min(sequence_lens[b], T) (a length past T
    reverses the whole line, as the reference's slicing does).
  - DFT-17/20: one MatMul by a constant float64-built DFT matrix. The transformed axis
    (attribute before opset 20, known input 2 from 20 on; not the last axis) is moved
    next to the last (complex) axis, both flattened: [..., N*C] x [N*C, M*O] ->
    [..., M, O], moved back. dft_length L (known input 1; default N, or 2(N-1) for an
    inverse onesided DFT) truncates or zero-pads the input; forward: M = L (L//2+1 when
    onesided), O = 2; inverse: 1/L scaling, M = L, O = 2, or with onesided numpy's
    irfft (Hermitian extension of the first L//2+1 bins, imaginary parts of the DC and
    Nyquist bins ignored) giving a real output, O = 1.
  - STFT-17: frames gathered with constant indices [frames, frame_length] (frame_step
    known, frame_length known or the window's length or the signal's), multiplied by
    the window when given, then the DFT along the frame axis (onesided by default).
  - TopK-1 (k attribute) -> k as an int64 constant input; TopK-10 has neither largest
    nor sorted (their defaults, 1). CumProd-26 is the catalogue's form.
  - MaxUnpool-9/11/22 (22 adds bfloat16): as onnx's reference, the values of X are
    scattered (ScatterElements on the flattened tensors, last write wins) at the flat
    indices I into zeros of the inferred shape [N, C, (in - 1) * stride - pad_begin -
    pad_end + kernel per axis], reshaped; a given output_shape (known input 2) pads that
    with zeros at the end of each axis (it may not be smaller than the inferred shape).
  - RoiAlign-10/16/22: the catalogue op (opset-16 form); RoiAlign-10 has no
    coordinate_transformation_mode and behaves as output_half_pixel (16's default is
    half_pixel), so its nodes get that attribute; 22 adds bfloat16.
  - GridSample-16/20/22: the catalogue op (opset-20 form). 16 defines 4-D inputs and
    modes bilinear (default), nearest, bicubic, read as linear, nearest, cubic (N-D
    inputs are read at 16 too); 20 renames the modes (default linear) and allows N-D;
    22 adds bfloat16. An opset-16 mode name at opset 20+ (or a new one before) is refused.
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx.base import (
    Builder,
    Context,
    Converted,
    Handler,
    OnnxNode,
    emit,
    ints_attr,
    label,
)
from hidetc.frontend.onnx.tensors import dtype_name


def _int64(values) -> np.ndarray:
    return np.array(list(values), dtype=np.int64)


def _known(node: OnnxNode, ctx: Context, index: int, what: str) -> np.ndarray:
    """The known value of input `index`, or ModelError saying it must be a constant."""
    value = ctx.values.get(node.input(index))
    if value is None:
        raise ModelError(f"{label(node)}: input {index} ({what}) must be a constant known "
                         f"at compile time (the output shape depends on it)")
    return np.asarray(value)


def _known_scalar(node: OnnxNode, ctx: Context, index: int, what: str,
                  integer: bool) -> np.ndarray:
    """The known one-element input `index`: an integer, or (integer=False) any number."""
    value = _known(node, ctx, index, what)
    if value.dtype.kind not in ("iu" if integer else "fiu") or value.size != 1:
        raise ModelError(f"{label(node)}: input {index} ({what}) must be one "
                         f"{'integer' if integer else 'number'}, got dtype {value.dtype} "
                         f"shape {list(value.shape)}")
    return value.reshape(())


def _known_int(node: OnnxNode, ctx: Context, index: int, what: str) -> int:
    return int(_known_scalar(node, ctx, index, what, integer=True))


def _axis(node: OnnxNode, axis: int, rank: int, what: str = "axis") -> int:
    if not -rank <= axis < rank:
        raise ModelError(f"{label(node)}: {what} {axis} is out of range for an input of "
                         f"rank {rank}")
    return axis % rank


# Scatter, EyeLike, windows -------------------------------------------------------------
def scatter(node: OnnxNode, ctx: Context) -> Converted:
    return emit(node, ctx, op="ScatterElements")


def eye_like(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    if x.rank != 2:
        raise ModelError(f"{label(node)}: input 0 has shape {list(x.shape)}, expected a 2-D "
                         f"tensor")
    dtype = x.dtype
    if "dtype" in node.attrs:
        dtype = dtype_name(int(node.attrs["dtype"]), f"{label(node)} attribute 'dtype'")
    eye = np.eye(*x.shape, k=int(node.attrs.get("k", 0)), dtype=np.dtype(dtype))
    return Converted((), {node.outputs[0]: eye})


def _hann(n: np.ndarray, size: int) -> np.ndarray:
    return np.sin(n * np.pi / size) ** 2


def _hamming(n: np.ndarray, size: int) -> np.ndarray:
    alpha = 25.0 / 46.0
    return alpha - np.cos(n * np.pi * 2 / size) * (1 - alpha)


def _blackman(n: np.ndarray, size: int) -> np.ndarray:
    return 0.42 - 0.5 * np.cos(n * np.pi * 2 / size) + 0.08 * np.cos(n * np.pi * 4 / size)


def _window(formula) -> Handler:
    def handler(node: OnnxNode, ctx: Context) -> Converted:
        size = _known_int(node, ctx, 0, "size")
        if size < 0:
            raise ModelError(f"{label(node)}: input 0 (size) is {size}, expected >= 0")
        dtype = dtype_name(int(node.attrs.get("output_datatype", 1)),
                           f"{label(node)} attribute 'output_datatype'")
        period = size if int(node.attrs.get("periodic", 1)) else size - 1
        values = formula(np.arange(size, dtype=np.float64), period) if size else np.zeros(0)
        return Converted((), {node.outputs[0]: values.astype(np.dtype(dtype))})
    return handler


def _known_float(node: OnnxNode, ctx: Context, index: int, what: str) -> float:
    return float(_known_scalar(node, ctx, index, what, integer=False))


def mel_weight_matrix(node: OnnxNode, ctx: Context) -> Converted:
    bins = _known_int(node, ctx, 0, "num_mel_bins")
    length = _known_int(node, ctx, 1, "dft_length")
    rate = _known_int(node, ctx, 2, "sample_rate")
    low, high = (_known_float(node, ctx, i, what)
                 for i, what in ((3, "lower_edge_hertz"), (4, "upper_edge_hertz")))
    dtype = dtype_name(int(node.attrs.get("output_datatype", 1)),
                       f"{label(node)} attribute 'output_datatype'")
    if bins < 1 or length < 1 or rate < 1:
        raise ModelError(f"{label(node)}: num_mel_bins {bins}, dft_length {length} and "
                         f"sample_rate {rate} must be positive")
    spectrum = length // 2 + 1
    ln10 = np.log(10)
    mel_low, mel_high = (2595 * np.log1p(np.float64(f) / 700) / ln10 for f in (low, high))
    mels = np.arange(bins + 2) * ((mel_high - mel_low) / (bins + 2)) + mel_low
    hertz = 700 * np.expm1(mels / 2595 * ln10)
    edges = (((length + 1) * hertz) // rate).astype(np.int64)
    if edges.min() < 0 or edges.max() >= spectrum:
        raise ModelError(f"{label(node)}: the mel edges {low:g}..{high:g} Hz fall on "
                         f"spectrogram bins {edges.min()}..{edges.max()}, outside 0.."
                         f"{spectrum - 1} (dft_length {length}, sample_rate {rate})")
    j = np.arange(spectrum, dtype=np.float64)
    weights = np.zeros((spectrum, bins))
    for i in range(bins):
        left, center, right = (int(e) for e in edges[i:i + 3])
        rising = (j - left) / max(center - left, 1)
        falling = (right - j) / max(right - center, 1)
        weights[:, i] = np.where((j >= left) & (j <= center), rising, 0)
        weights[:, i] = np.where((j >= center) & (j < right), falling, weights[:, i])
        if center == left:                  # no rising edge: the peak alone
            weights[center, i] = 1.0
    return Converted((), {node.outputs[0]: weights.astype(np.dtype(dtype))})


# Compress, ReverseSequence -------------------------------------------------------------
def compress(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    condition = _known(node, ctx, 1, "condition").reshape(-1).astype(bool)
    build = Builder(node, ctx)
    data, axis, extent = node.inputs[0], 0, x.size
    if "axis" in node.attrs:
        axis = _axis(node, int(node.attrs["axis"]), x.rank)
        extent = x.shape[axis]
    else:
        data = build.add("Reshape", [data, build.const("flat", _int64([x.size]))])
    chosen = np.flatnonzero(condition)
    if chosen.size and chosen[-1] >= extent:
        raise ModelError(f"{label(node)}: input 1 (condition) selects position "
                         f"{int(chosen[-1])}, past the axis extent {extent}")
    build.add("Gather", [data, build.const("indices", chosen.astype(np.int64))],
              out=node.outputs[0], axis=axis)
    return build.done()


def reverse_sequence(node: OnnxNode, ctx: Context) -> Converted:
    x, lens = ctx.types[node.inputs[0]], ctx.types[node.inputs[1]]
    if x.rank < 2:
        raise ModelError(f"{label(node)}: input 0 has shape {list(x.shape)}, expected rank "
                         f">= 2")
    batch_axis = _axis(node, int(node.attrs.get("batch_axis", 1)), x.rank, "batch_axis")
    time_axis = _axis(node, int(node.attrs.get("time_axis", 0)), x.rank, "time_axis")
    if batch_axis == time_axis or time_axis > 1 or batch_axis > 1:
        raise ModelError(f"{label(node)}: batch_axis {batch_axis} and time_axis {time_axis} "
                         f"must be 0 and 1 in some order")
    batch, steps = x.shape[batch_axis], x.shape[time_axis]
    if lens.shape != (batch,) or lens.dtype not in ("int32", "int64"):
        raise ModelError(f"{label(node)}: input 1 (sequence_lens) has {lens.dtype} "
                         f"{list(lens.shape)}, expected int64 [{batch}]")
    along = [1] * x.rank
    along[batch_axis] = batch
    build = Builder(node, ctx)
    length = node.inputs[1]
    if lens.dtype != "int64":
        length = build.add("Cast", [length], to="int64")
    length = build.add("Reshape", [length, build.const("lens_shape", _int64(along))])
    length = build.add("Min", [length, build.const("steps", np.array(steps, np.int64))])
    t_shape = [1] * x.rank
    t_shape[time_axis] = steps
    t = build.const("t", np.arange(steps, dtype=np.int64).reshape(t_shape))
    one = build.const("one", np.array(1, np.int64))
    flipped = build.add("Sub", [build.add("Sub", [length, one]), t])
    index = build.add("Where", [build.add("Less", [t, length]), flipped, t])
    index = build.add("Expand", [index, build.const("shape", _int64(x.shape))])
    build.add("GatherElements", [node.inputs[0], index], out=node.outputs[0],
              axis=time_axis)
    return build.done()


# DFT, STFT ------------------------------------------------------------------------------
def dft_matrix(n_in: int, channels: int, length: int, inverse: bool, onesided: bool
               ) -> np.ndarray:
    """float64 [n_in*channels, m*o]: row (n, c) times column (k, part) of the DFT of
    length `length` over the first min(n_in, length) samples (module docstring)."""
    real_out = inverse and onesided
    m = length if inverse or not onesided else length // 2 + 1
    used = min(n_in, length // 2 + 1 if real_out else length)
    n = np.arange(used)[:, None]
    k = np.arange(m)[None, :]
    theta = 2 * np.pi * ((n * k) % max(length, 1)) / max(length, 1)
    cos, sin = np.cos(theta), np.sin(theta)
    w = np.zeros((n_in, channels, m, 1 if real_out else 2))
    if real_out:      # rows: frequencies n (Hermitian weights), columns: samples k
        weight = np.where((n == 0) | (2 * n == length), 1.0, 2.0) / length
        w[:used, 0, :, 0] = weight * cos
        if channels == 2:
            w[:used, 1, :, 0] = -weight * sin
        return w.reshape(n_in * channels, m)
    sign, scale = (1.0, 1.0 / length) if inverse else (-1.0, 1.0)
    w[:used, 0, :, 0], w[:used, 0, :, 1] = scale * cos, scale * sign * sin
    if channels == 2:
        w[:used, 1, :, 0], w[:used, 1, :, 1] = -scale * sign * sin, scale * cos
    return w.reshape(n_in * channels, m * 2)


def _spectrum(build: Builder, x: str, shape: tuple[int, ...], axis: int, length: int,
              inverse: bool, onesided: bool, dtype: str, out: str) -> str:
    """The DFT of `x` (static `shape`, complex last axis) along `axis` (< rank - 1)."""
    rank, channels, n_in = len(shape), shape[-1], shape[axis]
    perm = [d for d in range(rank - 1) if d != axis] + [axis, rank - 1]
    moved = x if axis == rank - 2 else build.add("Transpose", [x], perm=tuple(perm))
    outer = [shape[d] for d in perm[:-2]]
    flat = build.add("Reshape", [moved, build.const("rows", _int64(outer + [n_in * channels]))])
    if dtype != "float64":
        flat = build.add("Cast", [flat], to="float64")
    matrix = dft_matrix(n_in, channels, length, inverse, onesided)
    product = build.add("MatMul", [flat, build.const("dft", matrix)])
    if dtype != "float64":
        product = build.add("Cast", [product], to=dtype)
    parts = 1 if inverse and onesided else 2
    m = matrix.shape[1] // parts
    back = [0] * rank
    for position, d in enumerate(perm):
        back[d] = position
    last = out if axis == rank - 2 else None
    result = build.add("Reshape", [product, build.const("out_shape", _int64(outer + [m, parts]))],
                       out=last)
    if axis != rank - 2:
        result = build.add("Transpose", [result], out=out, perm=tuple(back))
    return result


def _dft_check(node: OnnxNode, shape: tuple[int, ...], dtype: str) -> None:
    if len(shape) < 2 or shape[-1] not in (1, 2):
        raise ModelError(f"{label(node)}: input 0 has shape {list(shape)}, expected rank >= 2 "
                         f"with a last dimension of 1 (real) or 2 (complex)")
    if dtype not in ("float32", "float64"):
        raise ModelError(f"{label(node)}: input 0 has dtype {dtype}, expected float32 or "
                         f"float64")


def dft(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    _dft_check(node, x.shape, x.dtype)
    if ctx.opset >= 20:
        axis = _known_int(node, ctx, 2, "axis") if node.input(2) else -2
    else:
        axis = int(node.attrs.get("axis", 1))
    axis = _axis(node, axis, x.rank)
    if axis == x.rank - 1:
        raise ModelError(f"{label(node)}: axis {axis} is the last (complex) dimension")
    inverse, onesided = bool(node.attrs.get("inverse", 0)), bool(node.attrs.get("onesided", 0))
    n = x.shape[axis]
    length = 2 * (n - 1) if inverse and onesided else n
    if node.input(1):
        length = _known_int(node, ctx, 1, "dft_length")
    if length < 1:
        raise ModelError(f"{label(node)}: dft_length {length} must be positive")
    build = Builder(node, ctx)
    _spectrum(build, node.inputs[0], x.shape, axis, length, inverse, onesided, x.dtype,
              node.outputs[0])
    return build.done()


def stft(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    _dft_check(node, x.shape, x.dtype)
    if x.rank != 3:
        raise ModelError(f"{label(node)}: input 0 (signal) has shape {list(x.shape)}, "
                         f"expected [batch, length, 1 or 2]")
    step = _known_int(node, ctx, 1, "frame_step")
    window = ctx.types[node.input(2)] if node.input(2) else None
    if node.input(3):
        size = _known_int(node, ctx, 3, "frame_length")
    else:
        size = window.shape[0] if window is not None else x.shape[1]
    if window is not None and window.shape != (size,):
        raise ModelError(f"{label(node)}: input 2 (window) has shape {list(window.shape)}, "
                         f"expected [{size}]")
    if step < 1 or not 1 <= size <= x.shape[1]:
        raise ModelError(f"{label(node)}: frame_step {step} and frame_length {size} must be "
                         f"positive, frame_length at most the signal length {x.shape[1]}")
    frames = 1 + (x.shape[1] - size) // step
    starts = np.arange(frames, dtype=np.int64)[:, None] * step
    build = Builder(node, ctx)
    index = build.const("frames", starts + np.arange(size, dtype=np.int64)[None, :])
    framed = build.add("Gather", [node.inputs[0], index], axis=1)
    if window is not None:
        column = build.add("Reshape", [node.inputs[2], build.const("column", _int64([size, 1]))])
        framed = build.add("Mul", [framed, column])
    shape = (x.shape[0], frames, size, x.shape[2])
    onesided = bool(node.attrs.get("onesided", 1))
    _spectrum(build, framed, shape, 2, size, False, onesided, x.dtype, node.outputs[0])
    return build.done()


# TopK ------------------------------------------------------------------------------------
def top_k(node: OnnxNode, ctx: Context) -> Converted:
    if "k" not in node.attrs:
        return emit(node, ctx)
    name = ctx.fresh(f"{node.name or node.outputs[0]}/k")
    made = OnnxNode(node.op, (node.inputs[0], name), node.outputs, node.name,
                    node.without("k").attrs)
    return emit(made, ctx, constants={name: _int64([int(node.attrs["k"])])})


# MaxUnpool ------------------------------------------------------------------------------
def max_unpool(node: OnnxNode, ctx: Context) -> Converted:
    x, idx = ctx.types[node.inputs[0]], ctx.types[node.inputs[1]]
    if x.rank < 3 or idx.shape != x.shape or idx.dtype != "int64":
        raise ModelError(f"{label(node)}: inputs 0 (X) {x.dtype} {list(x.shape)} and 1 (I) "
                         f"{idx.dtype} {list(idx.shape)}: expected rank >= 3 and int64 "
                         f"indices of X's shape")
    k = x.rank - 2
    if "kernel_shape" not in node.attrs:
        raise ModelError(f"{label(node)}: attribute 'kernel_shape' is required")
    kernel = ints_attr(node, "kernel_shape", [], k)
    strides = ints_attr(node, "strides", [1] * k, k)
    pads = ints_attr(node, "pads", [0] * (2 * k), 2 * k)
    inferred = list(x.shape[:2]) + [(x.shape[2 + i] - 1) * strides[i] - pads[i] - pads[k + i]
                                    + kernel[i] for i in range(k)]
    shape = inferred
    if node.input(2):
        shape = [int(v) for v in _known(node, ctx, 2, "output_shape").reshape(-1)]
        if len(shape) != x.rank or any(s < i for s, i in zip(shape, inferred)):
            raise ModelError(f"{label(node)}: input 2 (output_shape) is {shape}, expected "
                             f"{x.rank} sizes of at least the inferred shape {inferred}")
    if any(n <= 0 for n in inferred):
        raise ModelError(f"{label(node)}: the inferred output shape {inferred} is empty")
    build = Builder(node, ctx)
    flat = build.const("flat", _int64([x.size]))
    values = build.add("Reshape", [node.inputs[0], flat])
    where = build.add("Reshape", [node.inputs[1], flat])
    zero = build.const("zero", np.zeros((), np.dtype(x.dtype)))
    zeros = build.add("Expand", [zero, build.const("size", _int64([int(np.prod(inferred))]))])
    scattered = build.add("ScatterElements", [zeros, where, values], axis=0)
    last = shape == inferred
    result = build.add("Reshape", [scattered, build.const("shape", _int64(inferred))],
                       out=node.outputs[0] if last else None)
    if not last:
        pads_out = [0] * x.rank + [s - i for s, i in zip(shape, inferred)]
        build.add("Pad", [result, build.const("pads", _int64(pads_out))], out=node.outputs[0])
    return build.done()


# GridSample -----------------------------------------------------------------------------
_GRID_SAMPLE_16_MODES = {"bilinear": "linear", "nearest": "nearest", "bicubic": "cubic"}


def grid_sample(node: OnnxNode, ctx: Context) -> Converted:
    if ctx.opset >= 20:
        return emit(node, ctx)
    mode = node.attrs.get("mode", "bilinear")
    if mode not in _GRID_SAMPLE_16_MODES:
        raise ModelError(f"{label(node)}: mode={mode!r} is not an opset-{ctx.opset} mode, "
                         f"expected one of {', '.join(_GRID_SAMPLE_16_MODES)}")
    return emit(node, ctx, mode=_GRID_SAMPLE_16_MODES[mode])


def roi_align(node: OnnxNode, ctx: Context) -> Converted:
    if ctx.opset < 16:
        return emit(node, ctx, coordinate_transformation_mode="output_half_pixel")
    return emit(node, ctx)


HANDLERS: dict[str, Handler] = {
    "Scatter": scatter,
    "EyeLike": eye_like,
    "HannWindow": _window(_hann),
    "HammingWindow": _window(_hamming),
    "BlackmanWindow": _window(_blackman),
    "Compress": compress,
    "ReverseSequence": reverse_sequence,
    "DFT": dft,
    "STFT": stft,
    "TopK": top_k,
    "GridSample": grid_sample,
    "RoiAlign": roi_align,
    "MaxUnpool": max_unpool,
    "MelWeightMatrix": mel_weight_matrix,
}
# ONNX ops read only as decompositions (not in the catalogue)
EXTRA_OPS: tuple[str, ...] = ("Scatter", "EyeLike", "HannWindow", "HammingWindow",
                              "BlackmanWindow", "Compress", "ReverseSequence", "DFT", "STFT",
                              "MaxUnpool", "MelWeightMatrix")
# ops whose schema history 1..28 this module reviewed (module docstring)
CHECKED: tuple[str, ...] = EXTRA_OPS + ("TopK", "CumProd", "GridSample", "RoiAlign")
# of CHECKED ops whose oldest read version is not opset 7's
FIRST_VERSION: dict[str, int] = {"Scatter": 9, "EyeLike": 9, "Compress": 9,
                                 "ReverseSequence": 10, "HannWindow": 17,
                                 "HammingWindow": 17, "BlackmanWindow": 17, "DFT": 17,
                                 "STFT": 17, "CumProd": 26, "GridSample": 16, "RoiAlign": 10,
                                 "MaxUnpool": 9, "MelWeightMatrix": 17}
# inputs whose values the decompositions need at compile time (the ONNX backend binds
# graph inputs feeding them before compiling)
VALUE_INPUTS: dict[str, tuple[int, ...]] = {
    "HannWindow": (0,), "HammingWindow": (0,), "BlackmanWindow": (0,), "Compress": (1,),
    "DFT": (1, 2), "STFT": (1, 3), "MaxUnpool": (2,), "MelWeightMatrix": (0, 1, 2, 3, 4),
}
