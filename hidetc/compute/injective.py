"""Injective op definitions: `COMPUTE[op](task, idx, load) -> Expr` is the value of the
output element at index `idx` (one Expr per output dimension), where `load(i, index)`
reads input `i` of the task at `index` (one Expr per input dimension).

Covers elementwise ops with numpy broadcasting (the attribute-reading binary ops Mod
and BitShift too), layout ops (Transpose, Reshape and its aliases, Slice, Concat,
Expand, Tile, Pad in its constant, edge, reflect and wrap modes, DepthToSpace in DCR
and CRD modes, SpaceToDepth), OneHot (indices truncated to int64, negative ones
counted from depth; an index outside [-depth, depth) selects no class), gathers, the
per-channel and windowed ops of
`hidetc.compute.nn` (PRelu, BatchNormalization, LRN, Trilu) and Resize
(`hidetc.compute.resize`). Indices read from tensors (Gather*) are normalized for
negative values; scalar operands (Clip's bounds, Pad's value, Trilu's k) may be 0-d or
one-element tensors.
"""
from __future__ import annotations

import dataclasses

from hidetc.compute.elementwise import BINARY, BINARY_ATTR, UNARY
from hidetc.compute.grid_sample import GRID_SAMPLE
from hidetc.compute.indexing import (  # noqa: F401  (re-exported: schedules, fusion)
    ZERO,
    Compute,
    Load,
    broadcast_index,
    linearize,
    load_broadcast,
    load_scalar,
    normalize,
    regroup,
    reshape_groups,
    unravel,
)
from hidetc.compute.nn import NN
from hidetc.compute.resize import RESIZE
from hidetc.compute.roi_align import ROI_ALIGN
from hidetc.compute.task import Task
from hidetc.errors import UnsupportedOpError
from hidetc.tir.ir import (
    INTS,
    Expr,
    as_expr,
    cast,
    const,
    eq,
    logical_and,
    maximum,
    minimum,
    select,
)

_load_broadcast = load_broadcast
_normalize = normalize


def _unary(task: Task, idx: list[Expr], load: Load) -> Expr:
    return UNARY[task.op](load(0, idx), dict(task.attrs))


def _variadic(task: Task, idx: list[Expr], load: Load) -> Expr:
    fn = BINARY[task.op]
    present = [i for i, t in enumerate(task.inputs) if t is not None]
    value = _load_broadcast(task, present[0], idx, load)
    for i in present[1:]:
        value = fn(value, _load_broadcast(task, i, idx, load))
    return value


def _binary_attr(task: Task, idx: list[Expr], load: Load) -> Expr:
    a, b = (_load_broadcast(task, i, idx, load) for i in range(2))
    return BINARY_ATTR[task.op](a, b, dict(task.attrs))


def _mean(task: Task, idx: list[Expr], load: Load) -> Expr:
    total = _variadic(dataclasses.replace(task, op="Sum"), idx, load)
    return total / as_expr(float(len(task.inputs)), total)


def _where(task: Task, idx: list[Expr], load: Load) -> Expr:
    cond, a, b = (_load_broadcast(task, i, idx, load) for i in range(3))
    return select(cond, a, b)


def _clip(task: Task, idx: list[Expr], load: Load) -> Expr:
    """max(lo, x) then min(hi, x) with the printers' NaN-keeping helpers -- the same
    value as `x < lo ? lo : x` then `x > hi ? hi : x` (NaN x stays NaN, -0 stays -0
    against a +0 bound) with x written once: as selects, a grafted chain of Clips
    (quantize -> dequantize -> quantize in a QDQ model's prologue) copied its operand
    four times per Clip, and the expression grew exponentially."""
    x = load(0, idx)
    if len(task.inputs) > 1 and task.inputs[1] is not None:
        x = maximum(load_scalar(task, 1, load), x)
    if len(task.inputs) > 2 and task.inputs[2] is not None:
        x = minimum(load_scalar(task, 2, load), x)
    return x


def _transpose(task: Task, idx: list[Expr], load: Load) -> Expr:
    rank = len(task.inputs[0].shape)
    perm = task.attr("perm") or tuple(reversed(range(rank)))
    src = [ZERO] * rank
    for out_axis, in_axis in enumerate(perm):
        src[in_axis] = idx[out_axis]
    return load(0, src)


def _reshape(task: Task, idx: list[Expr], load: Load) -> Expr:
    return load(0, regroup(idx, task.outputs[0].shape, task.inputs[0].shape))


def _slice_params(task: Task) -> list[tuple[int, int]]:
    """(start, step) per input axis, normalized as ONNX Slice does."""
    shape = task.inputs[0].shape
    starts = task.param(1)
    axes = task.param(3, tuple(range(len(starts))))
    steps = task.param(4, (1,) * len(starts))
    out = [(0, 1)] * len(shape)
    for start, axis, step in zip(starts, axes, steps):
        axis = axis + len(shape) if axis < 0 else axis
        n = shape[axis]
        start = start + n if start < 0 else start
        start = min(max(start, 0), n if step > 0 else n - 1)
        out[axis] = (start, step)
    return out


def _slice(task: Task, idx: list[Expr], load: Load) -> Expr:
    src = [i if (start, step) == (0, 1) else as_expr(start) + i * step
           for i, (start, step) in zip(idx, _slice_params(task))]
    return load(0, src)


def _concat(task: Task, idx: list[Expr], load: Load) -> Expr:
    axis = task.attr("axis") % len(task.outputs[0].shape)
    pieces, offset = [], 0
    for i, t in enumerate(task.inputs):
        src = list(idx)
        src[axis] = idx[axis] - offset if offset else idx[axis]
        offset += t.shape[axis]
        pieces.append((offset, load(i, src)))
    value = pieces[-1][1]
    for end, piece in reversed(pieces[:-1]):
        value = select(idx[axis] < end, piece, value)
    return value


def _expand(task: Task, idx: list[Expr], load: Load) -> Expr:
    return _load_broadcast(task, 0, idx, load)


def _tile(task: Task, idx: list[Expr], load: Load) -> Expr:
    shape = task.inputs[0].shape
    return load(0, [ZERO if n == 1 else i % n for i, n in zip(idx, shape)])


def _normalize(index: Expr, extent: int) -> Expr:
    index = cast(index, "int32")
    return select(index < 0, index + extent, index)


def _gather(task: Task, idx: list[Expr], load: Load) -> Expr:
    data = task.inputs[0].shape
    q = len(task.inputs[1].shape)
    axis = task.attr("axis", 0) % len(data)
    where = _normalize(load(1, idx[axis:axis + q]), data[axis])
    return load(0, list(idx[:axis]) + [where] + list(idx[axis + q:]))


def _gather_elements(task: Task, idx: list[Expr], load: Load) -> Expr:
    data = task.inputs[0].shape
    axis = task.attr("axis", 0) % len(data)
    src = list(idx)
    src[axis] = _normalize(load(1, idx), data[axis])
    return load(0, src)


def _gather_nd(task: Task, idx: list[Expr], load: Load) -> Expr:
    data, indices = task.inputs[0].shape, task.inputs[1].shape
    b = task.attr("batch_dims", 0)
    k = indices[-1]
    lead = list(idx[:len(indices) - 1])
    coords = [_normalize(load(1, lead + [as_expr(j)]), data[b + j]) for j in range(k)]
    return load(0, list(idx[:b]) + coords + list(idx[len(indices) - 1:]))


def _pad(task: Task, idx: list[Expr], load: Load) -> Expr:
    shape = task.inputs[0].shape
    rank = len(shape)
    pads = task.param(1)
    axes = task.param(3, tuple(range(rank)))
    begin = [0] * rank
    for j, axis in enumerate(axes):
        begin[axis % rank] = pads[j]
    src = [i - b if b else i for i, b in zip(idx, begin)]
    mode = task.attr("mode", "constant")
    if mode != "constant":
        out = task.outputs[0].shape
        return load(0, [_pad_source(mode, s, n) if b or o != n else s
                        for s, n, b, o in zip(src, shape, begin, out)])
    valid = [logical_and(s >= 0, s < n) for s, n in zip(src, shape)]
    value = load(0, [select(ok, s, ZERO) for ok, s in zip(valid, src)])
    has_fill = len(task.inputs) > 2 and task.inputs[2] is not None
    fill = load_scalar(task, 2, load) if has_fill else cast(as_expr(0), value.dtype)
    return select(logical_and(*valid), value, fill)


def _pad_source(mode: str, s: Expr, n: int) -> Expr:
    """The input position read at position s (in [-pad, n + pad)) of a padded axis:
    edge clamps, wrap is periodic (n), reflect is periodic (2(n - 1)) mirrored, as numpy's
    pad modes (any pad width)."""
    if mode == "edge" or n == 1:
        return minimum(maximum(s, ZERO), as_expr(n - 1))
    period = n if mode == "wrap" else 2 * (n - 1)
    m = (s % period + period) % period
    return m if mode == "wrap" else select(m < n, m, period - m)


def _depth_to_space(task: Task, idx: list[Expr], load: Load) -> Expr:
    b = int(task.attr("blocksize"))
    channels = task.outputs[0].shape[1]
    n, c, h, w = idx
    bh, bw = h % b, w % b
    if task.attr("mode", "DCR") == "CRD":
        source = c * (b * b) + bh * b + bw
    else:
        source = (bh * b + bw) * channels + c
    return load(0, [n, source, h // b, w // b])


def _space_to_depth(task: Task, idx: list[Expr], load: Load) -> Expr:
    b = int(task.attr("blocksize"))
    channels = task.inputs[0].shape[1]
    n, c, h, w = idx
    block = c // channels
    return load(0, [n, c % channels, h * b + block // b, w * b + block % b])


def _one_hot(task: Task, idx: list[Expr], load: Load) -> Expr:
    depth = _scalar(task.param(1))
    axis = task.attr("axis", -1) % len(task.outputs[0].shape)
    index = cast(load(0, idx[:axis] + idx[axis + 1:]), "int64")
    index = select(index < as_expr(0, index), index + as_expr(depth, index), index)
    hot = eq(index, cast(idx[axis], "int64"))
    return select(hot, load(2, [as_expr(1)]), load(2, [ZERO]))   # values: [off, on]


def _scalar(value) -> int:
    """A frozen parameter holding one number (0-d: the number; [1]: a 1-tuple)."""
    while isinstance(value, tuple):
        (value,) = value
    return int(value)


def _range(task: Task, idx, load) -> Expr:
    """Range of integers, computed (a Range whose limit is a symbolic size is not
    folded at compile time): out[i] = start + i * delta. (A float Range accumulates as
    ONNX Runtime does; it is folded when its limit is known, and refused here.)"""
    dtype = task.outputs[0].dtype
    if dtype not in INTS:
        raise UnsupportedOpError(f"Range: a {dtype} range of symbolic length is not "
                                 f"supported (integer ranges are)")
    start, delta = _number(task.param(0)), _number(task.param(2))
    return const(start, dtype) + cast(idx[0], dtype) * const(delta, dtype)


def _number(value):
    while isinstance(value, tuple):
        (value,) = value
    return value


def _unary_table() -> dict[str, Compute]:
    return {op: _unary for op in UNARY}


COMPUTE: dict[str, Compute] = {
    **_unary_table(),
    **{op: _variadic for op in BINARY},
    "Mean": _mean,
    "Where": _where,
    "Clip": _clip,
    "Transpose": _transpose,
    "Reshape": _reshape,
    "Flatten": _reshape,
    "Squeeze": _reshape,
    "Unsqueeze": _reshape,
    "Slice": _slice,
    "Concat": _concat,
    "Expand": _expand,
    "Tile": _tile,
    "Gather": _gather,
    "GatherElements": _gather_elements,
    "GatherND": _gather_nd,
    "Pad": _pad,
    "DepthToSpace": _depth_to_space,
    "SpaceToDepth": _space_to_depth,
    "OneHot": _one_hot,
    "Range": _range,
    **{op: _binary_attr for op in BINARY_ATTR},
    **NN,
    **RESIZE,
    **GRID_SAMPLE,
    **ROI_ALIGN,
}


def supported(task: Task) -> bool:
    return task.op in COMPUTE

