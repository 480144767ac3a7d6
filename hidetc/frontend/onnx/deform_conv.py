"""DeformConv (opsets 19, 22; 2-D) read as bilinear sampling (GridSample) at the offset
taps, then a grouped MatMul with the weights -- the im2col form of onnx's reference.

For X [N, C, H, W], W [OC, C/G, KH, KW], offset [N, OG*KH*KW*2, OH, OW] (per offset
group og and tap (i, j): dy, dx), optional B [OC] and mask [N, OG*KH*KW, OH, OW]:
  - tap positions y = oh*sH - pad_top + i*dH + dy, x = ow*sW - pad_left + j*dW + dx
    (the base positions a constant [KH, KW, OH, OW]), as GridSample coordinates the
    reference's way, align_corners=1: g = p / (size - 1) * 2 - 1 (integer and half
    positions round-trip exactly, so a tap on the border -1 weighs pixel 0 by exactly
    0); where H or W is 1 (the reference divides by zero there), align_corners=0:
    g = (2p + 1) / size - 1;
  - GridSample(mode linear, padding zeros: a corner outside the image contributes 0,
    as in the reference) of X's channels of offset group og, [N*OG, C/OG, H, W], at the
    grid [N*OG, KH*KW*OH, OW, 2] -> [N, C, KH*KW, OH*OW], times the mask;
  - per group g: W_g [OC/G, C/G*KH*KW] @ columns [N, G, C/G*KH*KW, OH*OW] (one batched
    MatMul), + B, reshaped to [N, OC, OH, OW].
float16/bfloat16 run in float32 and are rounded once. The output size is the
convolution's ((H + pads - dilated kernel) / stride + 1) and must be the offset's.
Other ranks (1-D, 3-D) are a ModelError (the reference implements 2-D only).
"""
from __future__ import annotations

import numpy as np

from hidetc.errors import ModelError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, ints_attr, label
from hidetc.graph.symbolic import shape_array

WORK_DTYPE = {"float16": "float32", "bfloat16": "float32"}


def deform_conv(node: OnnxNode, ctx: Context) -> Converted:
    x, w, off = (ctx.types[i] for i in node.inputs[:3])
    where = label(node)
    if x.rank != 4 or w.rank != 4 or off.rank != 4:
        raise ModelError(f"{where}: X {list(x.shape)}, W {list(w.shape)} and offset "
                         f"{list(off.shape)} must be 4-D (2-D DeformConv only)")
    n, c, h, wd = x.shape
    oc, cg, kh, kw = w.shape
    group, og = int(node.attrs.get("group", 1)), int(node.attrs.get("offset_group", 1))
    kernel = ints_attr(node, "kernel_shape", [kh, kw], 2)
    if kernel != [kh, kw]:
        raise ModelError(f"{where}: kernel_shape {kernel} is not W's {[kh, kw]}")
    if group < 1 or og < 1 or c != cg * group or oc % group or c % og:
        raise ModelError(f"{where}: X has {c} channels, W {list(w.shape)}: expected C = "
                         f"W.shape[1] * group ({cg} * {group}), OC divisible by group and "
                         f"C by offset_group {og}")
    sh, sw = ints_attr(node, "strides", [1, 1], 2)
    dh, dw = ints_attr(node, "dilations", [1, 1], 2)
    pt, pl, pb, pr = ints_attr(node, "pads", [0, 0, 0, 0], 4)
    if min(sh, sw, dh, dw) < 1 or min(pt, pl, pb, pr) < 0:
        raise ModelError(f"{where}: strides {[sh, sw]}, dilations {[dh, dw]} and pads "
                         f"{[pt, pl, pb, pr]}: expected strides and dilations >= 1, pads >= 0")
    oh = (h + pt + pb - ((kh - 1) * dh + 1)) // sh + 1
    ow = (wd + pl + pr - ((kw - 1) * dw + 1)) // sw + 1
    taps = kh * kw
    if off.shape != (n, og * taps * 2, oh, ow):
        raise ModelError(f"{where}: offset has shape {list(off.shape)}, expected "
                         f"{[n, og * taps * 2, oh, ow]} (N, offset_group*KH*KW*2, OH, OW)")
    mask = node.inputs[4] if len(node.inputs) > 4 and node.inputs[4] else None
    if mask and ctx.types[mask].shape != (n, og * taps, oh, ow):
        raise ModelError(f"{where}: mask has shape {list(ctx.types[mask].shape)}, expected "
                         f"{[n, og * taps, oh, ow]}")
    work = WORK_DTYPE.get(x.dtype, x.dtype)
    build = Builder(node, ctx)

    def as_work(name: str) -> str:
        return name if ctx.types[name].dtype == work else build.add("Cast", [name], to=work)

    def reshape(name: str, shape) -> str:
        return build.add("Reshape", [name, build.const("shape", shape_array(shape))])

    def const(what: str, array: np.ndarray) -> str:
        return build.const(what, array.astype(np.dtype(work)))

    offsets = reshape(as_work(node.inputs[2]), [n, og, kh, kw, 2, oh, ow])
    i, j, y, xx = np.meshgrid(np.arange(kh), np.arange(kw), np.arange(oh), np.arange(ow),
                              indexing="ij")
    corners = int(h > 1 and wd > 1)
    two, one = const("two", np.array(2.0)), const("one", np.array(1.0))
    coords = []
    for axis, base, size in ((1, -pl + xx * sw + j * dw, wd), (0, -pt + y * sh + i * dh, h)):
        start = build.const("start", np.array([axis], np.int64))
        step = build.add("Slice", [offsets, start, build.const("end", np.array([axis + 1],
                                                                                np.int64)),
                                   build.const("axis", np.array([4], np.int64))])
        position = build.add("Add", [const("base", base.reshape(kh, kw, 1, oh, ow)), step])
        if corners:
            scaled = build.add("Mul", [build.add("Div", [
                position, const("size", np.array(size - 1.0))]), two])
        else:
            scaled = build.add("Div", [build.add("Add", [build.add("Mul", [position, two]),
                                                         one]),
                                       const("size", np.array(float(size)))])
        # [n, og, kh, kw, 1, oh, ow] -> [..., oh, ow, 1]: the unit axis moves, memory does not
        coords.append(reshape(build.add("Sub", [scaled, one]), [n, og, kh, kw, oh, ow, 1]))
    grid = reshape(build.add("Concat", coords, axis=6), [n * og, taps * oh, ow, 2])
    images = reshape(as_work(node.inputs[0]), [n * og, c // og, h, wd])
    sampled = build.add("GridSample", [images, grid], mode="linear", padding_mode="zeros",
                        align_corners=corners)                       # [n*og, c/og, taps*oh, ow]
    sampled = reshape(sampled, [n, og, c // og, taps, oh * ow])
    if mask:
        sampled = build.add("Mul", [sampled, reshape(as_work(mask),
                                                     [n, og, 1, taps, oh * ow])])
    columns = reshape(sampled, [n, group, cg * taps, oh * ow])
    weights = reshape(as_work(node.inputs[1]), [group, oc // group, cg * taps])
    out = reshape(build.add("MatMul", [weights, columns]), [n, oc, oh, ow])
    if len(node.inputs) > 3 and node.inputs[3]:
        out = build.add("Add", [out, reshape(as_work(node.inputs[3]), [1, oc, 1, 1])])
    if work != x.dtype:
        out = build.add("Cast", [out], to=x.dtype)
    build.add("Identity", [out], out=node.outputs[0])
    return build.done()


HANDLERS = {"DeformConv": deform_conv}
EXTRA_OPS = ("DeformConv",)
CHECKED: tuple[str, ...] = ("DeformConv",)   # DeformConv-19; 22 only adds bfloat16
FIRST_VERSION: dict[str, int] = {"DeformConv": 19}
