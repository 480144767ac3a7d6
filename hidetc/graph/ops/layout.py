"""Internal layout ops, introduced by graph passes (never by the ONNX frontend):
ConvNHWC (ANCHOR), the channels-last 2-D convolution `choose_layout` rewrites Conv into,
and MaxPoolNHWC / AveragePoolNHWC (REDUCE), the channels-last 2-D pools it rewrites
MaxPool / AveragePool into on the cpu.

ConvNHWC(X, W, B?) -> Y: X is [N, H, W, C], W is [OC, KH, KW, C / group] (OHWI), B is
[OC], Y is [N, OH, OW, OC]. Attributes as Conv's, resolved: strides, dilations,
pads ([top, left, bottom, right]) and group; no auto_pad and no kernel_shape (it is
W's shape). Guarantees: the output geometry is Conv's (`window_geometry`), and the
reference is Conv's reference between transposes, so both ops agree exactly.
"""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import FLOAT_DTYPES, TensorType
from hidetc.graph.ops.common import arity, dtype_in, fail, fmt, present, rank_is, same_dtype
from hidetc.graph.ops.conv import _conv_ref, window_geometry
from hidetc.graph.ops.registry import OpKind, define, get_op

TO_NCHW, TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)


def _conv_nhwc_infer(types, attrs, values):
    op = "ConvNHWC"
    arity(op, types, 2, 3)
    dtype = dtype_in(op, types, 0, FLOAT_DTYPES)
    same_dtype(op, types, [0, 1, 2] if present(types, 2) else [0, 1])
    rank_is(op, types, 0, (4,))
    rank_is(op, types, 1, (4,))
    x, w = types[0].shape, types[1].shape
    group = attrs.get("group", 1)
    if group < 1 or x[3] % group or w[0] % group or w[3] * group != x[3]:
        fail(op, f"input 1 has shape {fmt(w)}: with group={group} expected dim 3 to be "
                 f"{x[3] // max(group, 1)} (channels {x[3]} / group) and dim 0 a multiple "
                 f"of {group}")
    if attrs.get("auto_pad", "NOTSET") != "NOTSET":
        fail(op, "auto_pad must be resolved into pads")
    if present(types, 2) and types[2].shape != (w[0],):
        fail(op, f"input 2 has shape {fmt(types[2].shape)}, expected [{w[0]}]")
    win = window_geometry(op, x[1:3], w[1:3], attrs)
    return [TensorType(dtype, (x[0],) + win.out + (w[0],))]


def _conv_nhwc_ref(inputs, attrs):
    x, w = inputs[0], inputs[1]
    nchw = [np.transpose(x, TO_NCHW), np.transpose(w, TO_NCHW)] + list(inputs[2:])
    (y,) = _conv_ref(nchw, attrs)
    return [np.ascontiguousarray(np.transpose(y, TO_NHWC))]


define("ConvNHWC", OpKind.ANCHOR, _conv_nhwc_infer, _conv_nhwc_ref)


# MaxPoolNHWC(X) -> Y, AveragePoolNHWC(X) -> Y: X [N, H, W, C], Y [N, OH, OW, C]; the
# attributes of MaxPool / AveragePool (2-D, one output). Shape rule and reference are
# the NCHW op's between transposes, so both agree exactly.
def _pool_nhwc(base: str):
    op = f"{base}NHWC"

    def infer(types, attrs, values):
        arity(op, types, 1)
        rank_is(op, types, 0, (4,))
        x = types[0]
        nchw = TensorType(x.dtype, tuple(x.shape[i] for i in TO_NCHW))
        (y,) = get_op(base).infer([nchw], attrs, [None])
        return [TensorType(y.dtype, tuple(y.shape[i] for i in TO_NHWC))]

    def reference(inputs, attrs):
        (y,) = get_op(base).reference([np.transpose(inputs[0], TO_NCHW)], attrs)
        return [np.ascontiguousarray(np.transpose(y, TO_NHWC))]
    define(op, OpKind.REDUCE, infer, reference)


_pool_nhwc("MaxPool")
_pool_nhwc("AveragePool")
