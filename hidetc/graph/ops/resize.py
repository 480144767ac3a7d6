"""Resize (INJECTIVE), opset-19 form: inputs X, roi, scales, sizes (roi/scales/sizes
optional, compile-time constants: the output shape depends on them; an empty tensor
counts as omitted, as opsets 11-13 write it); attributes mode (nearest, linear,
cubic), coordinate_transformation_mode (half_pixel, half_pixel_symmetric,
pytorch_half_pixel, align_corners, asymmetric, tf_crop_and_resize, and the opset-13
tf_half_pixel_for_nn), nearest_mode, cubic_coeff_a, exclude_outside,
extrapolation_value, antialias (linear and cubic), axes and keep_aspect_ratio_policy.

Semantics follow the ONNX specification and its reference implementation step by step
(`resize_spec` and `axis_coords` are shared with the compute definition,
`hidetc.compute.resize`, so both compute the same coordinates): the output size per axis
is floor(scale * in) (scales) or the given size (sizes; keep_aspect_ratio_policy
not_larger/not_smaller scales every listed axis by the min/max ratio and rounds half
up); the axes are interpolated one after another in `axes` order (all axes without
`axes`), an axis whose scale is 1 with an unchanged size (and a trivial roi) is left
alone; per output position y the source coordinate x_ori comes from the coordinate
mode (float64), the taps are the n nearest input positions (n = 2 for nearest and
linear, 4 for cubic, more with antialias when downsampling; edge-clamped), weighted by
the mode's coefficients of ratio = x_ori - floor(x_ori) (1 when x_ori is an integer);
tf_crop_and_resize positions outside the input take extrapolation_value. Results are
computed in float64 and cast back saturating (integers rounded half to even first).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from hidetc.graph.ir import TensorType
from hidetc.graph.ops.common import arity, dtype_in, fail, fmt, norm_axes, present
from hidetc.graph.ops.registry import OpKind, define
from hidetc.graph.symbolic import Dim, SymDim, as_dim

MODES = ("nearest", "linear", "cubic")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel",
                    "align_corners", "asymmetric", "tf_crop_and_resize",
                    "tf_half_pixel_for_nn")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
POLICIES = ("stretch", "not_larger", "not_smaller")


@dataclass(frozen=True)
class AxisSpec:
    """One interpolated axis: sizes, the float scale and its (start, end) roi."""
    axis: int
    in_n: int
    out_n: int
    scale: float
    roi: Optional[tuple]   # numpy scalars as the reference has them, or None


@dataclass(frozen=True)
class ResizeSpec:
    out_shape: tuple[int, ...]
    axes: tuple[AxisSpec, ...]   # in interpolation order, identity axes left out


def _given(value) -> Optional[np.ndarray]:
    return None if value is None or np.asarray(value).size == 0 else np.asarray(value)


def _scaled(factor: float, n: Dim) -> Dim:
    """floor(factor * n); a symbolic n only by an integer factor."""
    if isinstance(n, SymDim):
        if factor != int(factor):
            fail("Resize", f"a scale of {factor} on the symbolic dimension {n} is not "
                           f"an integer")
        return n * int(factor)
    return int(factor * n)


def resize_spec(attrs: dict, shape: tuple[int, ...], roi, scales, sizes) -> ResizeSpec:
    """The output shape and the interpolated axes (raises ShapeError when invalid)."""
    rank = len(shape)
    for key, allowed, default in (("mode", MODES, "nearest"),
                                  ("coordinate_transformation_mode", COORDINATE_MODES,
                                   "half_pixel"),
                                  ("nearest_mode", NEAREST_MODES, "round_prefer_floor"),
                                  ("keep_aspect_ratio_policy", POLICIES, "stretch")):
        if attrs.get(key, default) not in allowed:
            fail("Resize", f"{key}={attrs.get(key)!r}, expected one of {', '.join(allowed)}")
    if attrs.get("antialias", 0) and attrs.get("mode", "nearest") == "nearest":
        fail("Resize", "antialias=1 is not defined for mode='nearest'")
    roi, scales, sizes = _given(roi), _given(scales), _given(sizes)
    if (scales is None) == (sizes is None):
        fail("Resize", "exactly one of inputs 2 (scales) and 3 (sizes) must be given")
    axes_attr = attrs.get("axes")
    axes = list(norm_axes("Resize", axes_attr, rank)) if axes_attr is not None else None
    order = axes if axes is not None else list(range(rank))
    given = scales if scales is not None else sizes
    if given.shape != (len(order),):
        fail("Resize", f"input {2 if sizes is None else 3} has shape {fmt(given.shape)}, "
                       f"expected [{len(order)}]")
    if roi is not None and roi.shape != (2 * len(order),):
        fail("Resize", f"input 1 (roi) has shape {fmt(roi.shape)}, expected [{2 * len(order)}]")
    if roi is not None and axes is not None:
        full = [0.0] * rank + [1.0] * rank
        for i, d in enumerate(axes):
            full[d], full[rank + d] = roi[i], roi[len(axes) + i]
        roi = full
    if scales is not None:
        factors = [1.0] * rank
        for i, d in enumerate(order):
            factors[d] = scales[i]
        out = [_scaled(float(f), n) for f, n in zip(factors, shape)]
        if any(float(f) <= 0 for f in factors):
            fail("Resize", f"input 2 (scales) {scales.tolist()} must be positive")
    else:
        out = list(shape)
        for i, d in enumerate(order):
            out[d] = as_dim(sizes[i])
        if any(n < 0 for n in out) or any(n == 0 for n in shape):
            fail("Resize", f"input 3 (sizes) {sizes.tolist()} is invalid for input 0 "
                           f"{fmt(shape)}")
        factors = [o / n for o, n in zip(out, shape)]
        policy = attrs.get("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            scale = pick(factors[d] for d in order)
            factors = [scale if i in order else 1.0 for i in range(rank)]
            out = [int(scale * shape[i] + 0.5) if i in order else shape[i]
                   for i in range(rank)]
    specs = []
    for d in order:
        if isinstance(shape[d], SymDim) and not math.isclose(float(factors[d]), 1.0):
            fail("Resize", f"resizing the symbolic dimension {d} ({shape[d]}) is not "
                           f"supported")
        pair = None if roi is None else (roi[d], roi[d + rank])
        trivial = pair is None or (math.isclose(float(pair[0]), 0.0)
                                   and math.isclose(float(pair[1]), 1.0))
        if math.isclose(float(factors[d]), 1.0) and out[d] == shape[d] and trivial:
            continue
        specs.append(AxisSpec(d, shape[d], out[d], float(factors[d]), pair))
    return ResizeSpec(tuple(out), tuple(specs))


def axis_coords(attrs: dict, a: AxisSpec, y):
    """x_ori for output positions y (a float64 numpy array, or a float64 IR expression)
    in the reference's order of operations (constants derived from the roi with the
    reference's numpy scalar arithmetic, then as Python floats), and for
    tf_crop_and_resize the valid range (0, in - 1) (outside: extrapolation_value).
    x_ori is None when the mode maps every position to 0 (align_corners, one output)."""
    mode = attrs.get("coordinate_transformation_mode", "half_pixel")
    width = a.scale * a.in_n
    if mode == "align_corners":
        return (None if width == 1 else y * (a.in_n - 1) / (width - 1)), None
    if mode == "asymmetric":
        return y / a.scale, None
    if mode == "tf_half_pixel_for_nn":
        return (y + 0.5) / a.scale, None
    if mode == "tf_crop_and_resize":
        start, end = a.roi
        span, origin = float(end - start), float(start * (a.in_n - 1))
        if width == 1:
            middle = float((end - start) * (a.in_n - 1) / 2)
            return y * 0.0 + middle + origin, (0, a.in_n - 1)
        return y * span * (a.in_n - 1) / (width - 1) + origin, (0, a.in_n - 1)
    if mode == "pytorch_half_pixel":
        return (y * 0.0 - 0.5 if width == 1 else (y + 0.5) / a.scale - 0.5), None
    if mode == "half_pixel":
        return (y + 0.5) / a.scale - 0.5, None
    adjustment = a.out_n / width    # half_pixel_symmetric
    offset = a.in_n / 2 * (1 - adjustment)
    return offset + (y + 0.5) / a.scale - 0.5, None


def tap_count(attrs: dict, scale: float) -> tuple[int, int]:
    """(number of taps n, first tap offset of the antialias kernels or 0)."""
    mode = attrs.get("mode", "nearest")
    if not attrs.get("antialias", 0) or mode == "nearest":
        return (4 if mode == "cubic" else 2), 0
    s = min(scale, 1.0)
    if mode == "linear":
        start = int(np.floor(-1 / s) + 1)
        return 2 - 2 * start, start
    start = int(np.floor(-2 / s) + 1)
    return 2 - 2 * start, start


def _coeffs(attrs: dict, ratio: np.ndarray, scale: float) -> np.ndarray:
    """[positions, taps] float64 coefficients of the reference's get_coeffs."""
    mode = attrs.get("mode", "nearest")
    n, start = tap_count(attrs, scale)
    if mode == "nearest":
        rule = attrs.get("nearest_mode", "round_prefer_floor")
        second = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                  "floor": np.zeros_like(ratio, bool), "ceil": np.ones_like(ratio, bool)}[rule]
        second = second | (ratio == 1)
        return np.stack([~second, second], 1).astype(np.float64)
    a = float(attrs.get("cubic_coeff_a", -0.75))
    if not attrs.get("antialias", 0):
        if mode == "linear":
            return np.stack([1 - ratio, ratio], 1)
        r, q = ratio, 1 - ratio
        return np.stack([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                         ((a + 2) * r - (a + 3)) * r * r + 1,
                         ((a + 2) * q - (a + 3)) * q * q + 1,
                         ((a * (q + 1) - 5 * a) * (q + 1) + 8 * a) * (q + 1) - 4 * a], 1)
    s = min(scale, 1.0)
    if mode == "linear":
        c = np.clip(1 - np.abs((np.arange(start, start + n)[None, :] - ratio[:, None]) * s),
                    0, 1)
    else:
        x = np.abs(s * (np.arange(start, start + n)[None, :] - ratio[:, None]))
        c = np.where(x <= 1, (a + 2) * x ** 3 - (a + 3) * x * x + 1,
                     np.where(x < 2, a * x ** 3 - 5 * a * x * x + 8 * a * x - 4 * a, 0.0))
    total = c[:, 0].copy()
    for k in range(1, n):
        total = total + c[:, k]
    return c / total[:, None]


def _interpolate_axis(data: np.ndarray, attrs: dict, a: AxisSpec) -> np.ndarray:
    y = np.arange(a.out_n, dtype=np.float64)
    x_ori, bounds = axis_coords(attrs, a, y)
    x_ori = np.zeros(a.out_n) if x_ori is None else x_ori
    floor = np.floor(x_ori)
    ratio = np.where(x_ori == floor, 1.0, x_ori - floor)
    coeffs = _coeffs(attrs, ratio, a.scale)
    n = coeffs.shape[1]
    pad = int(np.ceil(n / 2))
    padded = x_ori + pad
    p = np.floor(padded).astype(np.int64)
    frac = padded - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    taps = (p + offset)[:, None] + np.arange(n)[None, :] - pad
    if attrs.get("exclude_outside", 0):
        coeffs = np.where((taps < 0) | (taps >= a.in_n), 0.0, coeffs)
        total = coeffs[:, :1].copy()
        for k in range(1, n):
            total = total + coeffs[:, k:k + 1]
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    gathered = np.take(data, np.clip(taps, 0, a.in_n - 1), axis=a.axis)
    shape = (1,) * a.axis + coeffs.shape + (1,) * (data.ndim - a.axis - 1)
    result = (gathered * coeffs.reshape(shape)).sum(axis=a.axis + 1)
    if bounds is not None:
        outside = (x_ori < bounds[0]) | (x_ori > bounds[1])
        mask = outside.reshape((1,) * a.axis + (-1,) + (1,) * (data.ndim - a.axis - 1))
        result = np.where(mask, float(attrs.get("extrapolation_value", 0.0)), result)
    return result


def saturate(values: np.ndarray, dtype) -> np.ndarray:
    """float64 -> dtype as the ONNX reference's saturate_cast."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return np.clip(np.round(values), info.min, info.max).astype(dtype)
    info = np.finfo(dtype)
    return np.clip(values, info.min, info.max).astype(dtype)


def _params(values):
    return [values[i] if i < len(values) else None for i in (1, 2, 3)]


def _resize_infer(types, attrs, values):
    arity("Resize", types, 1, 4)
    if present(types, 2):
        dtype_in("Resize", types, 2, ("float32",))
    if present(types, 3):
        dtype_in("Resize", types, 3, ("int64",))
    for i, what in ((1, "roi"), (2, "scales"), (3, "sizes")):
        if present(types, i) and (i >= len(values) or values[i] is None):
            fail("Resize", f"input {i} ({what}) must be a constant known at compile time")
    spec = resize_spec(attrs, types[0].shape, *_params(values))
    return [TensorType(types[0].dtype, spec.out_shape)]


def _resize_ref(inputs, attrs):
    x = inputs[0]
    spec = resize_spec(attrs, x.shape, *_params(inputs))
    result = x.astype(np.float64)
    for a in spec.axes:
        result = _interpolate_axis(result, attrs, a)
    return [saturate(result, x.dtype)]


define("Resize", OpKind.INJECTIVE, _resize_infer, _resize_ref, value_inputs=(1, 2, 3))
