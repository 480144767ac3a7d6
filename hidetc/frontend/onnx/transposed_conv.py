"""ConvTranspose and Col2Im read as a stride-1 Conv of a zero-stuffed input (the 2-D
catalogue Conv and its tuned kernels; 1-D and 3-D through `spatial.py`'s lowering).

Assumes static shapes (`ctx.types`); Col2Im's `image_shape`/`block_shape` inputs
(`VALUE_INPUTS`) known at import time (`ctx.values`). Guarantees:
  - ConvTranspose-1..22 (1-D to 3-D; version 1 read as version 11: its schema splits
    a padding computed from output_shape or SAME_* the other way round, but ONNX
    Runtime splits it as version 11 does for every version): a stride-1 Conv of the
    zero-stuffed input (Reshape [N, C, H, 1, ...] times a one-hot [1, s, ...] mask ->
    Reshape; a Mul, not a Pad, so the fused prologue lowers to plain index
    arithmetic), padded (the Conv's
    pads; negative pads crop: Slice) by (k-1)*d - pads_begin in front and up to the
    output size behind, with the weights regrouped [C, M/g, k...] -> [M, C/g, k...]
    and flipped (folded when constant). output_shape: the output size; its pads are
    the node's explicit pads, or else total = stride*(in-1) + output_padding +
    (k-1)*d + 1 - output_shape split as the spec says (SAME_UPPER: total//2 in front,
    else total - total//2);
  - Col2Im-18: a ConvTranspose with group C of the blocks [N, C*K, blocks...] with
    one-hot weights [C*K, 1, block...];
"""
from __future__ import annotations

import math

import numpy as np

from hidetc.errors import ModelError, UnsupportedOpError
from hidetc.frontend.onnx.base import Context, Converted, OnnxNode, label
from hidetc.frontend.onnx.spatial import INT64_MIN, Shape, _Build, _conv, _known, _window


def _stuffed(b: _Build, x: str, strides: Shape) -> str:
    """`x` with strides-1 zeros after every spatial element: [N, C, in*s...], as
    [N, C, in, 1, ...] times a one-hot [s, ...] mask (no padding select to lower)."""
    xs = b.shape[x]
    if all(s == 1 for s in strides):
        return x
    spread = b.reshape(x, xs[:2] + tuple(v for i in xs[2:] for v in (i, 1)))
    mask = np.zeros((1, 1) + tuple(v for s in strides for v in (1, s)), dtype=b.dtype)
    mask[(0, 0) + (0,) * 2 * len(strides)] = 1
    grown = b.op("Mul", [spread, b.constant("stuffing", mask)],
                 xs[:2] + tuple(v for i, s in zip(xs[2:], strides) for v in (i, s)))
    return b.reshape(grown, xs[:2] + tuple(i * s for i, s in zip(xs[2:], strides)))


def _flipped(b: _Build, w: str, group: int) -> str:
    """ConvTranspose weights [C, M/g, k...] as Conv weights [M, C/g, k...], flipped."""
    ws = b.shape[w]
    c, mg, kernel = ws[0], ws[1], ws[2:]
    dims = len(kernel)
    grouped = b.reshape(w, (group, c // group, mg) + kernel)
    moved = b.transpose(grouped, (0, 2, 1) + tuple(range(3, 3 + dims)))
    regrouped = b.reshape(moved, (group * mg, c // group) + kernel)
    return b.slice(regrouped, list(range(2, 2 + dims)), [-1] * dims, [INT64_MIN] * dims,
                   [-1] * dims)


def _transposed(b: _Build, x: str, w: str, bias: str, group: int, strides: Shape,
                dilations: Shape, begin: Shape, out: Shape) -> str:
    """ConvTranspose: output[i] = full[i + begin] for i < out, full being the untrimmed
    transposed convolution (zeros past its end)."""
    xs, ws = b.shape[x], b.shape[w]
    spans = [(k - 1) * d + 1 for k, d in zip(ws[2:], dilations)]
    stuffed = _stuffed(b, x, strides)
    front = [sp - 1 - p for sp, p in zip(spans, begin)]
    back = [o + sp - 1 - f - n * s for o, sp, f, n, s in zip(out, spans, front, xs[2:], strides)]
    # crops as a Slice, pads as the Conv's own (predicated) pads
    padded = b.pad(stuffed, [0, 0] + [min(0, f) for f in front],
                   [0, 0] + [min(0, e) for e in back])
    dims = len(out)
    win = _window(ws[2:], (1,) * dims, dilations, [max(0, f) for f in front],
                  [max(0, e) for e in back], (0,) * dims, out)
    return _conv(b, padded, _flipped(b, w, group), bias, win, group)


def _ints(node: OnnxNode, key: str, dims: int, default: int) -> Shape:
    values = tuple(int(v) for v in node.attrs.get(key, (default,) * dims))
    if len(values) != dims:
        raise ModelError(f"{label(node)}: attribute {key}={list(values)} has {len(values)} "
                         f"entries, expected {dims}")
    return values


def _transposed_pads(node: OnnxNode, sizes: Shape, kernel: Shape, strides: Shape,
                     dilations: Shape) -> tuple[Shape, Shape]:
    """(leading pads, output sizes) of a ConvTranspose node."""
    dims = len(sizes)
    extra = _ints(node, "output_padding", dims, 0)
    full = [s * (n - 1) + e + (k - 1) * d + 1
            for s, n, e, k, d in zip(strides, sizes, extra, kernel, dilations)]
    auto_pad = node.attrs.get("auto_pad", "NOTSET")
    shape = node.attrs.get("output_shape")
    if shape is not None:
        shape = tuple(int(v) for v in shape)[-dims:]
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        shape = tuple(n * s for n, s in zip(sizes, strides))
    explicit = auto_pad == "VALID" or (auto_pad == "NOTSET" and "pads" in node.attrs)
    if explicit or shape is None:
        pads = (0,) * 2 * dims if auto_pad == "VALID" else _ints(node, "pads", 2 * dims, 0)
        if shape is None:
            shape = tuple(f - a - z for f, a, z in zip(full, pads[:dims], pads[dims:]))
        return pads[:dims], shape
    totals = [f - o for f, o in zip(full, shape)]
    if auto_pad == "SAME_UPPER":
        return tuple(t // 2 for t in totals), shape
    return tuple(t - t // 2 for t in totals), shape


def conv_transpose(node: OnnxNode, ctx: Context) -> Converted:
    x, w = ctx.types[node.inputs[0]], ctx.types[node.inputs[1]]
    group = int(node.attrs.get("group", 1))
    if x.rank not in (3, 4, 5) or w.rank != x.rank:
        raise UnsupportedOpError(f"{label(node)}: inputs X {list(x.shape)} and W "
                                 f"{list(w.shape)} must both have rank 3, 4 or 5")
    if group < 1 or x.shape[1] % group or w.shape[0] != x.shape[1]:
        raise ModelError(f"{label(node)}: input W {list(w.shape)} must have dim 0 = the "
                         f"{x.shape[1]} channels of X, divisible by group={group}")
    dims = x.rank - 2
    kernel = tuple(int(v) for v in node.attrs.get("kernel_shape", w.shape[2:]))
    if kernel != w.shape[2:]:
        raise ModelError(f"{label(node)}: attribute kernel_shape={list(kernel)} does not "
                         f"match input W {list(w.shape)}")
    strides = _ints(node, "strides", dims, 1)
    dilations = _ints(node, "dilations", dims, 1)
    begin, out = _transposed_pads(node, x.shape[2:], kernel, strides, dilations)
    if min(out) < 1:
        raise ModelError(f"{label(node)}: output spatial shape {list(out)} is empty")
    b = _Build(node, ctx)
    y = _transposed(b, node.inputs[0], node.inputs[1], node.input(2), group, strides,
                    dilations, begin, out)
    b.finish(y, node.outputs[0])
    return b.done()


# ---------------------------------------------------------------- Col2Im, CenterCropPad

def col2im(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    image = _known(node, ctx, 1, "image_shape")
    block = _known(node, ctx, 2, "block_shape")
    dims = len(image)
    taps = math.prod(block)
    if x.rank != 3 or len(block) != dims or not 1 <= dims <= 3 or x.shape[1] % taps:
        raise ModelError(f"{label(node)}: input 0 {list(x.shape)} must be [N, C*{taps}, L] "
                         f"for block_shape {list(block)} and image_shape {list(image)} "
                         f"(1 to 3 dims)")
    strides = _ints(node, "strides", dims, 1)
    dilations = _ints(node, "dilations", dims, 1)
    pads = _ints(node, "pads", 2 * dims, 0)
    blocks = tuple((i + pads[a] + pads[dims + a] - (k - 1) * d - 1) // s + 1
                   for a, (i, k, s, d) in enumerate(zip(image, block, strides, dilations)))
    if min(blocks) < 1 or math.prod(blocks) != x.shape[2]:
        raise ModelError(f"{label(node)}: input 0 has {x.shape[2]} blocks, expected "
                         f"{' * '.join(map(str, blocks))} for image_shape {list(image)}")
    channels = x.shape[1] // taps
    weights = np.zeros((channels, taps, 1, taps), dtype=np.dtype(x.dtype))
    weights[:, np.arange(taps), 0, np.arange(taps)] = 1
    b = _Build(node, ctx)
    w = b.constant("one_hot", weights.reshape((channels * taps, 1) + block))
    grid = b.reshape(node.inputs[0], x.shape[:2] + blocks)
    y = _transposed(b, grid, w, "", channels, strides, dilations, pads[:dims], image)
    b.finish(y, node.outputs[0])
    return b.done()


HANDLERS = {"ConvTranspose": conv_transpose, "Col2Im": col2im}
EXTRA_OPS: tuple[str, ...] = ("ConvTranspose", "Col2Im")
# ConvTranspose-11 fixed the SAME_UPPER/SAME_LOWER pad split (read from 11), 22 adds
# bfloat16; Col2Im has one version (18).
VALUE_INPUTS: dict[str, tuple[int, ...]] = {"Col2Im": (1, 2)}
CHECKED: tuple[str, ...] = ("ConvTranspose", "Col2Im")
FIRST_VERSION: dict[str, int] = {"ConvTranspose": 1}
