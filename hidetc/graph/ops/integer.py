"""Integer products (ANCHOR): MatMulInteger, ConvInteger (ONNX), and ConvIntegerNHWC (the
channels-last form `choose_layout` rewrites ConvInteger into).

MatMulInteger(A, B, a_zero?, b_zero?) -> int32: numpy's batched, broadcast MatMul of
(A - a_zero) and (B - b_zero), A and B uint8 or int8 (each zero point of its operand's
type). a_zero is per tensor (a scalar or one element: the frontend keeps ONNX's per-row
form as a decomposition); b_zero a scalar, one element, or [N] per column of a 2-D B.

ConvInteger(X, W, x_zero?, w_zero?) -> int32: Conv (the float op's attributes and
geometry) of (X - x_zero) and (W - w_zero), the padding zero in that shifted space (the
input padded with x_zero); x_zero per tensor, w_zero a scalar or [OC] per output channel.
ConvIntegerNHWC: the same with X [N, H, W, C], W [OC, KH, KW, C / group] (OHWI), Y
[N, OH, OW, OC], attributes resolved as ConvNHWC's (`hidetc.graph.ops.layout`).

References: exact -- the shifted operands in int64 (or float64 for the convolution's
im2col matmul: integers below 2^53 are exact there, and every partial sum of 8-bit
products over K < 2^37 terms is), the result cast to int32 (an int32 accumulator:
exact while |sum| < 2^31, i.e. K * 255 * 255 < 2^31 in the worst case, K <= 33025; what
ONNX Runtime's kernels accumulate in too).
"""
from __future__ import annotations

import numpy as np

from hidetc.graph.ir import TensorType
from hidetc.graph.ops.common import arity, dtype_in, fail, fmt, present
from hidetc.graph.ops.registry import OpKind, define, get_op

QUANTIZED = ("uint8", "int8")


def _zero_point(op: str, types, i: int, operand: int, lengths: tuple[int, ...]) -> None:
    """Input i, the zero point of input `operand`: its type, one element or one of
    `lengths` (per column / channel)."""
    if not present(types, i):
        return
    if types[i].dtype != types[operand].dtype:
        fail(op, f"input {i} (zero point) has type {types[i].dtype}, expected "
                 f"{types[operand].dtype} (input {operand}'s)")
    if types[i].size != 1 and types[i].shape not in tuple((n,) for n in lengths):
        want = " or ".join(["a scalar"] + [f"[{n}]" for n in lengths])
        fail(op, f"input {i} (zero point) has shape {fmt(types[i].shape)}, expected {want}")


def _matmul_infer(types, attrs, values):
    op = "MatMulInteger"
    arity(op, types, 2, 4)
    for i in (0, 1):
        dtype_in(op, types, i, QUANTIZED)
    a, b = types[0], types[1]
    (y,) = get_op("MatMul").infer([TensorType("float32", a.shape),
                                   TensorType("float32", b.shape)], {}, [None, None])
    _zero_point(op, types, 2, 0, ())
    _zero_point(op, types, 3, 1, (b.shape[-1],) if b.rank == 2 else ())
    return [TensorType("int32", y.shape)]


def _shifted(x: np.ndarray, zero, work=np.int64, axis: int = -1) -> np.ndarray:
    """x - zero in `work`: zero one element, or a vector along `axis` of x."""
    x = x.astype(work)
    if zero is None:
        return x
    zero = np.asarray(zero).astype(work).reshape(-1)
    if zero.size == 1:
        return x - zero[0]
    shape = [1] * x.ndim
    shape[axis] = zero.size
    return x - zero.reshape(shape)


def _matmul_ref(inputs, attrs):
    a, b = inputs[0], inputs[1]
    zeros = list(inputs[2:]) + [None] * (4 - len(inputs))
    return [np.matmul(_shifted(a, zeros[0]), _shifted(b, zeros[1])).astype(np.int32)]


def _conv_types(op: str, base: str, types, attrs) -> list[TensorType]:
    arity(op, types, 2, 4)
    for i in (0, 1):
        dtype_in(op, types, i, QUANTIZED)
    (y,) = get_op(base).infer([TensorType("float32", types[0].shape),
                               TensorType("float32", types[1].shape)], attrs, [None, None])
    _zero_point(op, types, 2, 0, ())
    _zero_point(op, types, 3, 1, (types[1].shape[0],))
    return [TensorType("int32", y.shape)]


def _conv_ref(base: str):
    def reference(inputs, attrs):
        x, w = inputs[0], inputs[1]
        zeros = list(inputs[2:]) + [None] * (4 - len(inputs))
        xs = _shifted(x, zeros[0], np.float64)
        ws = _shifted(w, zeros[1], np.float64, axis=0)
        (y,) = get_op(base).reference([xs, ws], attrs)
        return [np.rint(y).astype(np.int64).astype(np.int32)]
    return reference


define("MatMulInteger", OpKind.ANCHOR, _matmul_infer, _matmul_ref)
define("ConvInteger", OpKind.ANCHOR,
       lambda types, attrs, values: _conv_types("ConvInteger", "Conv", types, attrs),
       _conv_ref("Conv"))
define("ConvIntegerNHWC", OpKind.ANCHOR,
       lambda types, attrs, values: _conv_types("ConvIntegerNHWC", "ConvNHWC", types, attrs),
       _conv_ref("ConvNHWC"))
