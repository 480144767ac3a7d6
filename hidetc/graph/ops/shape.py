"""Data-movement ops (INJECTIVE): Reshape, Flatten, Transpose, Squeeze, Unsqueeze,
Concat, Split, Slice, Expand, Tile, Pad, DepthToSpace, SpaceToDepth.

Assumes the latest-opset input forms: Reshape's shape, Squeeze/Unsqueeze axes, Split's
split, Slice's starts/ends/axes/steps, Expand's shape, Tile's repeats and Pad's pads/axes
are INPUTS whose values must be compile-time constants. Split's canonical form has
either the `split` input or the `num_outputs` attribute (the frontend sets num_outputs
from the node's output count when neither is given). Guarantees: shapes follow ONNX
(Reshape 0/-1 and allowzero, Slice clamping and negative steps, Pad negative pads).
"""
from __future__ import annotations

import math

import numpy as np

from hidetc.graph.ir import TensorType
from hidetc.graph.ops.common import (
    INDEX,
    arity,
    broadcast,
    dtype_in,
    fail,
    fmt,
    int_list,
    norm_axes,
    norm_axis,
    present,
    rank_is,
    same_dtype,
)
from hidetc.graph.ops.registry import OpKind, define
from hidetc.graph.symbolic import Dim, SymDim


def reshape_target(op: str, shape: tuple[int, ...], spec: list[int], allowzero: bool):
    """Resolve a Reshape shape spec (0 = copy, -1 = infer) against an input shape."""
    out = []
    for i, d in enumerate(spec):
        if d == 0 and not allowzero:
            if i >= len(shape):
                fail(op, f"input 1 (shape) {spec}: 0 at position {i} but input 0 {fmt(shape)} "
                         f"has rank {len(shape)}")
            d = shape[i]
        elif d < -1:
            fail(op, f"input 1 (shape) {spec} has invalid entry {d}")
        out.append(d)
    if out.count(-1) > 1:
        fail(op, f"input 1 (shape) {spec} has more than one -1")
    total = math.prod(shape)
    known = math.prod(d for d in out if d != -1)
    if -1 in out:
        if allowzero and 0 in out:
            fail(op, f"input 1 (shape) {spec} has both 0 and -1 with allowzero=1")
        if known == 0 or total % known:
            fail(op, f"input 1 (shape) {spec}: cannot infer -1 for input 0 {fmt(shape)}")
        out[out.index(-1)] = total // known
    elif known != total:
        fail(op, f"input 1 (shape) {spec} has {known} elements, input 0 {fmt(shape)} has {total}")
    return tuple(out)


def _reshape_infer(types, attrs, values):
    arity("Reshape", types, 2)
    dtype_in("Reshape", types, 1, ("int64",))
    spec = int_list("Reshape", values, 1, "shape")
    shape = reshape_target("Reshape", types[0].shape, spec, bool(attrs.get("allowzero", 0)))
    return [TensorType(types[0].dtype, shape)]


def _reshape_ref(inputs, attrs):
    spec = [int(v) for v in inputs[1].ravel()]
    return [inputs[0].reshape(reshape_target("Reshape", inputs[0].shape, spec,
                                             bool(attrs.get("allowzero", 0))))]


def _flatten_shape(shape: tuple[int, ...], axis: int) -> tuple[int, int]:
    axis = axis + len(shape) if axis < 0 else axis
    return math.prod(shape[:axis]), math.prod(shape[axis:])


def _flatten_infer(types, attrs, values):
    arity("Flatten", types, 1)
    rank = types[0].rank
    axis = attrs.get("axis", 1)
    if not -rank <= axis <= rank:
        fail("Flatten", f"axis {axis} is out of range for rank {rank}")
    return [TensorType(types[0].dtype, _flatten_shape(types[0].shape, axis))]


def _flatten_ref(inputs, attrs):
    return [inputs[0].reshape(_flatten_shape(inputs[0].shape, attrs.get("axis", 1)))]


def _perm(op: str, attrs: dict, rank: int) -> tuple[int, ...]:
    perm = attrs.get("perm")
    if perm is None:
        return tuple(range(rank - 1, -1, -1))
    if sorted(perm) != list(range(rank)):
        fail(op, f"attribute perm={list(perm)} is not a permutation of {rank} axes")
    return tuple(perm)


def _transpose_infer(types, attrs, values):
    arity("Transpose", types, 1)
    perm = _perm("Transpose", attrs, types[0].rank)
    return [TensorType(types[0].dtype, tuple(types[0].shape[p] for p in perm))]


def _transpose_ref(inputs, attrs):
    return [np.transpose(inputs[0], _perm("Transpose", attrs, inputs[0].ndim)).copy()]


def _squeeze_axes(op: str, types, values) -> tuple[int, ...]:
    shape = types[0].shape
    if not present(types, 1):
        for i, d in enumerate(shape):
            if isinstance(d, SymDim) and d.bounds()[0] <= 1:
                fail(op, f"without axes, whether dim {i} ({d}) is squeezed depends on its "
                         f"size; give the axes")
        return tuple(i for i, d in enumerate(shape) if d == 1)
    axes = norm_axes(op, int_list(op, values, 1, "axes"), len(shape))
    for a in axes:
        if shape[a] != 1:
            fail(op, f"input 0 has shape {fmt(shape)}: cannot squeeze axis {a} of size {shape[a]}")
    return axes


def _squeeze_infer(types, attrs, values):
    arity("Squeeze", types, 1, 2)
    axes = _squeeze_axes("Squeeze", types, values)
    shape = tuple(d for i, d in enumerate(types[0].shape) if i not in axes)
    return [TensorType(types[0].dtype, shape)]


def _unsqueeze_infer(types, attrs, values):
    arity("Unsqueeze", types, 2)
    rank = types[0].rank
    axes = int_list("Unsqueeze", values, 1, "axes")
    axes = norm_axes("Unsqueeze", axes, rank + len(axes))
    dims = iter(types[0].shape)
    shape = tuple(1 if i in axes else next(dims) for i in range(rank + len(axes)))
    return [TensorType(types[0].dtype, shape)]


def _retype_ref(infer):
    """Reference for ops that only change the shape: reshape to the inferred shape."""
    def reference(inputs, attrs):
        types = [None if x is None else TensorType.of(x) for x in inputs]
        return [inputs[0].reshape(infer(types, attrs, inputs)[0].shape)]
    return reference


def _concat_infer(types, attrs, values):
    arity("Concat", types, 1, 1 << 16)
    dtype = same_dtype("Concat", types, list(range(len(types))))
    first = types[0].shape
    axis = norm_axis("Concat", attrs.get("axis", 0), max(len(first), 1))
    for i, t in enumerate(types):
        if t.rank != len(first) or any(a != b for j, (a, b) in enumerate(zip(t.shape, first))
                                       if j != axis):
            fail("Concat", f"input {i} has shape {fmt(t.shape)}, expected {fmt(first)} except "
                           f"along axis {axis}")
    total = sum(t.shape[axis] for t in types)
    return [TensorType(dtype, first[:axis] + (total,) + first[axis + 1:])]


def _concat_ref(inputs, attrs):
    return [np.concatenate(inputs, axis=attrs.get("axis", 0))]


def split_sizes(op: str, types, attrs: dict, values) -> tuple[int, list[int]]:
    """(axis, sizes) of a canonical Split node."""
    shape = types[0].shape
    axis = norm_axis(op, attrs.get("axis", 0), len(shape))
    dim = shape[axis]
    if present(types, 1):
        sizes = int_list(op, values, 1, "split")
        if sum(sizes) != dim or any(s < 0 for s in sizes):
            fail(op, f"input 1 (split) {sizes} does not sum to dim {dim} of input 0 {fmt(shape)} "
                     f"along axis {axis}")
        return axis, sizes
    count = attrs.get("num_outputs")
    if count is None or count < 1:
        fail(op, "needs the split input or a positive num_outputs attribute")
    chunk = -(-dim // count)
    if chunk * (count - 1) > dim:
        fail(op, f"cannot split dim {dim} of input 0 {fmt(shape)} into {count} outputs")
    return axis, [chunk] * (count - 1) + [dim - chunk * (count - 1)]


def _split_infer(types, attrs, values):
    arity("Split", types, 1, 2)
    axis, sizes = split_sizes("Split", types, attrs, values)
    shape = types[0].shape
    return [TensorType(types[0].dtype, shape[:axis] + (s,) + shape[axis + 1:]) for s in sizes]


def _split_ref(inputs, attrs):
    types = [None if x is None else TensorType.of(x) for x in inputs]
    axis, sizes = split_sizes("Split", types, attrs, inputs)
    return [a.copy() for a in np.split(inputs[0], np.cumsum(sizes)[:-1], axis=axis)]


def slice_params(op: str, types, values) -> list[slice]:
    """One Python slice per axis of input 0, with ONNX clamping applied."""
    shape = types[0].shape
    starts = int_list(op, values, 1, "starts")
    ends = int_list(op, values, 2, "ends")
    axes = int_list(op, values, 3, "axes") if present(types, 3) else list(range(len(starts)))
    steps = int_list(op, values, 4, "steps") if present(types, 4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        fail(op, f"starts/ends/axes/steps have different lengths "
                 f"{len(starts)}/{len(ends)}/{len(axes)}/{len(steps)}")
    result = [slice(None)] * len(shape)
    for start, end, axis, step in zip(starts, ends, norm_axes(op, axes, len(shape)), steps):
        if step == 0:
            fail(op, f"input 4 (steps) has a zero step for axis {axis}")
        result[axis] = _clamped(start, end, step, shape[axis])
    return result


def _clamped(start: int, end: int, step: int, dim: int) -> slice:
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0 or dim == 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    return slice(start, None if end < 0 else end, step)


def _slice_infer(types, attrs, values):
    arity("Slice", types, 3, 5)
    for i in range(1, 5):
        if present(types, i):
            dtype_in("Slice", types, i, INDEX)
    slices = slice_params("Slice", types, values)
    shape = tuple(_slice_length(s, d) for s, d in zip(slices, types[0].shape))
    return [TensorType(types[0].dtype, shape)]


def _slice_length(s: slice, dim: Dim) -> Dim:
    """The length of a clamped slice of a dimension; with symbolic bounds, a forward
    slice's length as an expression (its sign decided over the symbols' ranges)."""
    if not any(isinstance(v, SymDim) for v in (s.start, s.stop, dim)):
        return len(range(*s.indices(dim)))
    step = 1 if s.step is None else s.step
    if step > 0:
        start = 0 if s.start is None else s.start
        stop = dim if s.stop is None else s.stop
        length = (stop - start + step - 1) // step
    else:                                  # (_clamped: stop None is before the first)
        start = dim - 1 if s.start is None else s.start
        stop = -1 if s.stop is None else s.stop
        length = (start - stop - step - 1) // -step
    return max(length, 0)


def _slice_ref(inputs, attrs):
    types = [None if x is None else TensorType.of(x) for x in inputs]
    return [inputs[0][tuple(slice_params("Slice", types, inputs))].copy()]


def _expand_infer(types, attrs, values):
    arity("Expand", types, 2)
    dtype_in("Expand", types, 1, ("int64",))
    target = int_list("Expand", values, 1, "shape")
    return [TensorType(types[0].dtype, broadcast("Expand", [types[0].shape, target]))]


def _expand_ref(inputs, attrs):
    target = [int(v) for v in inputs[1].ravel()]
    shape = broadcast("Expand", [inputs[0].shape, target])
    return [np.broadcast_to(inputs[0], shape).copy()]


def _tile_infer(types, attrs, values):
    arity("Tile", types, 2)
    dtype_in("Tile", types, 1, ("int64",))
    repeats = int_list("Tile", values, 1, "repeats")
    if len(repeats) != types[0].rank or any(r < 0 for r in repeats):
        fail("Tile", f"input 1 (repeats) {repeats} must have {types[0].rank} non-negative entries")
    return [TensorType(types[0].dtype, tuple(d * r for d, r in zip(types[0].shape, repeats)))]


def _tile_ref(inputs, attrs):
    return [np.tile(inputs[0], [int(r) for r in inputs[1].ravel()])]


PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def pad_widths(op: str, types, values) -> list[tuple[int, int]]:
    """Per-axis (begin, end) pad widths; negative values crop."""
    rank = types[0].rank
    pads = int_list(op, values, 1, "pads")
    axes = (norm_axes(op, int_list(op, values, 3, "axes"), rank) if present(types, 3)
            else tuple(range(rank)))
    if len(pads) != 2 * len(axes):
        fail(op, f"input 1 (pads) has {len(pads)} entries, expected {2 * len(axes)}")
    widths = [(0, 0)] * rank
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[i + len(axes)])
    for axis, (b, e) in enumerate(widths):
        if types[0].shape[axis] + b + e < 0:
            fail(op, f"input 1 (pads) {pads} crops axis {axis} of input 0 "
                     f"{fmt(types[0].shape)} below zero")
    return widths


def _pad_infer(types, attrs, values):
    arity("Pad", types, 2, 4)
    dtype_in("Pad", types, 1, ("int64",))
    if attrs.get("mode", "constant") not in PAD_MODES:
        fail("Pad", f"mode={attrs.get('mode')!r} is not one of {', '.join(PAD_MODES)}")
    if present(types, 2):
        same_dtype("Pad", types, [0, 2])
    widths = pad_widths("Pad", types, values)
    shape = tuple(d + b + e for d, (b, e) in zip(types[0].shape, widths))
    return [TensorType(types[0].dtype, shape)]


def _pad_ref(inputs, attrs):
    x = inputs[0]
    types = [None if v is None else TensorType.of(v) for v in inputs]
    widths = pad_widths("Pad", types, inputs)
    crop = tuple(slice(max(-b, 0), d - max(-e, 0)) for d, (b, e) in zip(x.shape, widths))
    x = x[crop]
    grow = [(max(b, 0), max(e, 0)) for b, e in widths]
    mode = PAD_MODES[attrs.get("mode", "constant")]
    if mode != "constant":
        return [np.pad(x, grow, mode=mode)]
    value = inputs[2].reshape(()) if len(inputs) > 2 and inputs[2] is not None else 0
    return [np.pad(x, grow, mode="constant", constant_values=value)]


def _space_infer(name: str):
    def infer(types, attrs, values):
        arity(name, types, 1)
        rank_is(name, types, 0, (4,))
        n, c, h, w = types[0].shape
        b = attrs.get("blocksize", 0)
        if b < 1:
            fail(name, f"attribute blocksize={b} must be positive")
        if name == "DepthToSpace":
            if c % (b * b):
                fail(name, f"input 0 has shape {fmt(types[0].shape)}: channels not divisible "
                           f"by blocksize^2={b * b}")
            return [TensorType(types[0].dtype, (n, c // (b * b), h * b, w * b))]
        if h % b or w % b:
            fail(name, f"input 0 has shape {fmt(types[0].shape)}: height/width not divisible by "
                       f"blocksize={b}")
        return [TensorType(types[0].dtype, (n, c * b * b, h // b, w // b))]
    return infer


def _depth_to_space_ref(inputs, attrs):
    x, b = inputs[0], attrs["blocksize"]
    n, c, h, w = x.shape
    if attrs.get("mode", "DCR") == "DCR":
        y = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    return [y.reshape(n, c // (b * b), h * b, w * b)]


def _space_to_depth_ref(inputs, attrs):
    x, b = inputs[0], attrs["blocksize"]
    n, c, h, w = x.shape
    y = x.reshape(n, c, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4)
    return [y.reshape(n, c * b * b, h // b, w // b)]


define("Reshape", OpKind.INJECTIVE, _reshape_infer, _reshape_ref, value_inputs=(1,))
define("Flatten", OpKind.INJECTIVE, _flatten_infer, _flatten_ref)
define("Transpose", OpKind.INJECTIVE, _transpose_infer, _transpose_ref)
define("Squeeze", OpKind.INJECTIVE, _squeeze_infer, _retype_ref(_squeeze_infer),
       value_inputs=(1,))
define("Unsqueeze", OpKind.INJECTIVE, _unsqueeze_infer, _retype_ref(_unsqueeze_infer),
       value_inputs=(1,))
define("Concat", OpKind.INJECTIVE, _concat_infer, _concat_ref)
define("Split", OpKind.INJECTIVE, _split_infer, _split_ref, value_inputs=(1,))
define("Slice", OpKind.INJECTIVE, _slice_infer, _slice_ref, value_inputs=(1, 2, 3, 4))
define("Expand", OpKind.INJECTIVE, _expand_infer, _expand_ref, value_inputs=(1,))
define("Tile", OpKind.INJECTIVE, _tile_infer, _tile_ref, value_inputs=(1,))
define("Pad", OpKind.INJECTIVE, _pad_infer, _pad_ref, value_inputs=(1, 3))
define("DepthToSpace", OpKind.INJECTIVE, _space_infer("DepthToSpace"), _depth_to_space_ref)
define("SpaceToDepth", OpKind.INJECTIVE, _space_infer("SpaceToDepth"), _space_to_depth_ref)
