"""Quantization ops read as decompositions into catalogue ops (Cast, Div, Mul, Add, Sub,
Round, Clip, Reshape, Gather, ReduceMax/Min, Max/Min, Equal, Where, MatMul, Conv),
computing what the onnx reference implementation (onnx.reference.ops) computes.

Schema history reviewed (1..28): QuantizeLinear-10 (per-tensor), -13 (`axis`: per-axis),
-19 (`saturate`, float8 only; float16/bfloat16 x and scale), -21 (`block_size`,
`output_dtype`, int16/uint16/int4), -23 (`precision`; scale type free of x's), 24/25/28
(float8e8m0 scales, int2, float6: type lists only). DequantizeLinear-10, -13 (`axis`),
-19, -21 (`block_size`), -23 (`output_dtype`), 24/25/28 (type lists). DynamicQuantize-
Linear-11, QLinearMatMul-10/-21 (float16/bfloat16 scales), QLinearConv-10,
MatMulInteger-10, ConvInteger-10: one definition each. Quantized types: uint8, int8,
uint16, int16, the sub-byte int4/uint4/int2/uint2, float8 (e4m3fn, e4m3fnuz, e5m2,
e5m2fnuz) and float4e2m1, as far as the graph has those dtypes (the narrow ones are
only ever Cast: the catalogue's Cast implements their conversions and `saturate`); any
other type (float6, a float8 or float4 input of QLinearMatMul...) is a one-line
ModelError. A float8e8m0 scale promotes like float32.

Scales and zero points (`_broadcastable`): a scalar or one-element tensor is per-tensor;
a 1-D tensor without `block_size` is per-axis (its length must be x's `axis` dim); with
`block_size` B it has x's rank and x's shape except at `axis`, where S*B >= D: element j
along `axis` uses scale j // B (a Gather with constant indices).

QuantizeLinear: q = x / scale in the reference's precision (numpy's promotion of x and
scale: the wider float, float64 when an int32 is involved; `precision` overrides), then
Round (half to even), Add the zero point (in float32, or float64 when q is: exact, since
|round(q)| < 2^24 is an integer and the zero point has 16 bits; a larger |round(q)|
saturates either way), Clip to the output type's range, Cast. The output type is the
zero point's, else `output_dtype`, else uint8 (a mismatch is a ModelError). A NaN input
gives an unspecified value (the reference's int32 cast of NaN is undefined too). As the
reference does, a float8 output is Cast(q, saturate) without the zero point, a float4
one Cast(q + zero point) (its Cast always saturates), no Round for either.
DequantizeLinear: (Cast(x, float32) - zero point) * scale; the subtraction in float64
when the zero point is int32 (numpy's promotion), cast to `output_dtype` or the scale's.
A float8/float4 x ignores its zero point (the reference requires a float8 one to be zero
and ignores a float4 one).
DynamicQuantizeLinear: uint8, the reference's float32 steps one by one.

Integer products (MatMulInteger, ConvInteger, and the integer core of QLinearMatMul /
QLinearConv): 8-bit operands with a per-tensor first zero point (and a per-tensor or
per-column / per-channel second one; a 1-D convolution lifted to 2-D) are the catalogue's
integer ops
(`hidetc.graph.ops.integer`: exact int32, the integer kernels). Otherwise (ONNX's
per-row zero points, 16-bit operands) the float decomposition: the operands,
widened and with zero points subtracted, are integers of magnitude <= span (255 for
8-bit types) and every partial sum of a dot product of K terms is an integer of
magnitude <= K * span_a * span_b. Float32 represents every integer up to 2^24 exactly, so
when that bound is <= 2^24 (K <= 258 for 8-bit operands) every fma and add in any order
is exact and float32 is used; otherwise float64 (exact up to 2^53: K < 1.3e11 for 8-bit
operands, beyond any tensor hidetc compiles). The result is cast to int32 (exact).
QLinearMatMul/QLinearConv then follow the reference: the multiplier a_scale * b_scale /
y_scale in the scales' type, the int32 product times it in float64 (numpy promotes int32
x float32 to float64), plus y_zero_point, Round, Clip, Cast (QLinearConv's reference
clips before rounding: the same, as the bounds are integers). QLinearConv's int32 bias is
added in float64 (exact). Per-row a / per-column b scales and zero points of
QLinearMatMul and MatMulInteger are read as the spec describes them.
"""
from __future__ import annotations

import math

import numpy as np

from hidetc.errors import ModelError, ShapeError
from hidetc.frontend.onnx.base import Builder, Context, Converted, OnnxNode, label, scalar
from hidetc.frontend.onnx.tensors import dtype_name
from hidetc.graph.ir import FLOAT_DTYPES, TensorType
from hidetc.graph.ops.conv import window_geometry

QUANTIZED = ("uint8", "int8", "uint16", "int16")
NARROW_INTS = {"int4": (-8, 7), "uint4": (0, 15), "int2": (-2, 1), "uint2": (0, 3)}
FLOAT8 = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
FLOAT4 = "float4_e2m1fn"
QUANTIZED_OUTPUTS = QUANTIZED + tuple(NARROW_INTS) + FLOAT8 + (FLOAT4,)
CONV_ATTRS = ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
EXACT_FLOAT32 = 2 ** 24


def _int64(values) -> np.ndarray:
    return np.array(list(values), dtype=np.int64)


def _cast(build: Builder, name: str, have: str, want: str) -> str:
    return name if have == want else build.add("Cast", [name], to=want)


def _type(node: OnnxNode, ctx: Context, index: int) -> TensorType | None:
    name = node.input(index)
    return ctx.types[name] if name else None


def _quantized(node: OnnxNode, dtype: str, what: str,
               allowed: tuple[str, ...] = QUANTIZED) -> str:
    if dtype not in allowed:
        raise ModelError(f"{label(node)}: {what} has type {dtype}, expected one of "
                         f"{', '.join(allowed)}")
    return dtype


def _int_range(dtype: str) -> tuple[int, int]:
    if dtype in NARROW_INTS:
        return NARROW_INTS[dtype]
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def _axis(node: OnnxNode, rank: int) -> int:
    axis = int(node.attrs.get("axis", 1))
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise ModelError(f"{label(node)}: axis {axis} is out of range for an input of rank "
                         f"{rank}")
    return axis % max(rank, 1)


def _broadcastable(build: Builder, index: int, x: TensorType) -> str:
    """Input `index` (a scale or zero point) made broadcastable to x (module docstring)."""
    node, ctx = build.node, build.ctx
    name, value = node.inputs[index], ctx.types[node.inputs[index]]
    if value.rank == 0:
        return name
    if value.size == 1:
        return build.add("Reshape", [name, build.const("scalar_shape", _int64(()))])
    axis, block = _axis(node, x.rank), int(node.attrs.get("block_size", 0))
    if block < 0:
        raise ModelError(f"{label(node)}: block_size {block} must be positive")
    if not block:
        if value.rank != 1 or x.rank == 0 or value.shape[0] != x.shape[axis]:
            raise ModelError(f"{label(node)}: input {index} has shape {list(value.shape)}, "
                             f"expected a scalar or [{x.shape[axis] if x.rank else 1}] "
                             f"(per-axis along axis {axis} of {list(x.shape)})")
        dims = [1] * x.rank
        dims[axis] = value.shape[0]
        return build.add("Reshape", [name, build.const("axis_shape", _int64(dims))])
    want = list(x.shape)
    want[axis] = value.shape[axis] if value.rank == x.rank else -1
    if list(value.shape) != want or value.shape[axis] * block < x.shape[axis]:
        raise ModelError(f"{label(node)}: input {index} has shape {list(value.shape)}, "
                         f"expected x's shape {list(x.shape)} with ceil({x.shape[axis]} / "
                         f"{block}) at axis {axis} (blocked quantization)")
    indices = build.const("block_index", _int64(j // block for j in range(x.shape[axis])))
    return build.add("Gather", [name, indices], axis=axis)


def _division_dtype(node: OnnxNode, x: str, scale: str) -> str:
    """The precision of x / scale: `precision`, else numpy's promotion of the two."""
    if node.attrs.get("precision"):
        return dtype_name(int(node.attrs["precision"]), f"{label(node)} attribute precision")
    x, scale = (d if d in FLOAT_DTYPES + ("int32",) else "float32" for d in (x, scale))
    if x not in FLOAT_DTYPES or scale not in FLOAT_DTYPES:
        return "float64"
    if x == scale:
        return x
    if {x, scale} == {"float16", "bfloat16"}:
        return "float32"
    return max(x, scale, key=lambda d: np.dtype(d).itemsize)


def _saturate(build: Builder, value: str, work: str, out_dtype: str, out: str) -> str:
    """Clip `value` (integral, in float `work`) to out_dtype's range and Cast to it."""
    low, high = _int_range(out_dtype)
    clipped = build.add("Clip", [value, build.const("low", scalar(low, work)),
                                 build.const("high", scalar(high, work))])
    return build.add("Cast", [clipped], out=out, to=out_dtype)


def _quantize_output_dtype(node: OnnxNode, ctx: Context) -> str:
    zero = _type(node, ctx, 2)
    attr = int(node.attrs.get("output_dtype", 0))
    wanted = dtype_name(attr, f"{label(node)} attribute output_dtype") if attr else None
    if zero is not None and wanted is not None and wanted != zero.dtype:
        raise ModelError(f"{label(node)}: output_dtype {wanted} differs from y_zero_point's "
                         f"type {zero.dtype}")
    dtype = zero.dtype if zero is not None else wanted or "uint8"
    return _quantized(node, dtype, "the output (y_zero_point / output_dtype)",
                      QUANTIZED_OUTPUTS)


def quantize_linear(node: OnnxNode, ctx: Context) -> Converted:
    x, scale = ctx.types[node.inputs[0]], ctx.types[node.inputs[1]]
    out_dtype = _quantize_output_dtype(node, ctx)
    work = _division_dtype(node, x.dtype, scale.dtype)
    build = Builder(node, ctx)
    s = _cast(build, _broadcastable(build, 1, x), scale.dtype, work)
    q = build.add("Div", [_cast(build, node.inputs[0], x.dtype, work), s])
    if out_dtype in FLOAT8:   # the zero point is not used (the reference ignores it)
        saturate = int(node.attrs.get("saturate", 1))
        build.add("Cast", [q], out=node.outputs[0], to=out_dtype, saturate=saturate)
        return build.done()
    if out_dtype == FLOAT4:
        if node.input(2):
            zero = _cast(build, _broadcastable(build, 2, x), out_dtype, work)
            q = build.add("Add", [q, zero])
        build.add("Cast", [q], out=node.outputs[0], to=out_dtype)
        return build.done()
    q = build.add("Round", [q])
    wide = work if work == "float64" else "float32"
    q = _cast(build, q, work, wide)
    if node.input(2):
        zero = _cast(build, _broadcastable(build, 2, x), out_dtype, wide)
        q = build.add("Add", [q, zero])
    _saturate(build, q, wide, out_dtype, node.outputs[0])
    return build.done()


def dequantize_linear(node: OnnxNode, ctx: Context) -> Converted:
    x, scale = ctx.types[node.inputs[0]], ctx.types[node.inputs[1]]
    _quantized(node, x.dtype, "input 0", QUANTIZED_OUTPUTS + ("int32",))
    attr = int(node.attrs.get("output_dtype", 0))
    out_dtype = dtype_name(attr, f"{label(node)} attribute output_dtype") if attr else scale.dtype
    build = Builder(node, ctx)
    dx, work = build.add("Cast", [node.inputs[0]], to="float32"), "float32"
    if node.input(2) and x.dtype not in FLOAT8 + (FLOAT4,):
        zero_type = ctx.types[node.inputs[2]].dtype
        if zero_type != x.dtype:
            raise ModelError(f"{label(node)}: x_zero_point has type {zero_type}, expected "
                             f"x's type {x.dtype}")
        work = "float64" if zero_type == "int32" else "float32"
        zero = _cast(build, _broadcastable(build, 2, x), zero_type, work)
        dx = build.add("Sub", [_cast(build, dx, "float32", work), zero])
    s = _cast(build, _broadcastable(build, 1, x), scale.dtype, work)
    y = build.add("Mul", [dx, s], out=node.outputs[0] if work == out_dtype else None)
    if work != out_dtype:
        build.add("Cast", [y], out=node.outputs[0], to=out_dtype)
    return build.done()


def dynamic_quantize_linear(node: OnnxNode, ctx: Context) -> Converted:
    x = ctx.types[node.inputs[0]]
    if x.dtype != "float32":
        raise ModelError(f"{label(node)}: input 0 has type {x.dtype}, expected float32")
    outputs = list(node.outputs) + [""] * (3 - len(node.outputs))
    build = Builder(node, ctx)
    zero = build.const("zero", scalar(0.0, "float32"))
    one = build.const("one", scalar(1.0, "float32"))
    high = build.add("Max", [build.add("ReduceMax", [node.inputs[0]], keepdims=0), zero])
    low = build.add("Min", [build.add("ReduceMin", [node.inputs[0]], keepdims=0), zero])
    span = build.add("Where", [build.add("Equal", [high, low]), one,
                               build.add("Sub", [high, low])])
    y_scale = build.add("Div", [span, build.const("qrange", scalar(255.0, "float32"))],
                        out=outputs[1] or None)
    initial = build.add("Sub", [zero, build.add("Div", [low, y_scale])])
    clipped = build.add("Clip", [initial, zero, build.const("qmax", scalar(255.0, "float32"))])
    zero_point = build.add("Round", [clipped])
    if outputs[2]:
        build.add("Cast", [zero_point], out=outputs[2], to="uint8")
    q = build.add("Round", [build.add("Div", [node.inputs[0], y_scale])])
    _saturate(build, build.add("Add", [q, zero_point]), "float32", "uint8", outputs[0])
    return build.done()


def _product_dtype(k: int, a: str, b: str) -> str:
    """float32 when every partial sum of K products stays exact in it, else float64."""
    span = [int(np.iinfo(d).max) - int(np.iinfo(d).min) for d in (a, b)]
    return "float32" if k * span[0] * span[1] <= EXACT_FLOAT32 else "float64"


def _operand_zero_point(build: Builder, index: int, operand: TensorType, row: bool,
                        what: str) -> str:
    """A MatMul operand's scale or zero point: per tensor, per row of a (`row`: length
    M, read as [M, 1]), per column of b (length N), or N-D (broadcast as is)."""
    node, ctx = build.node, build.ctx
    name, value = node.inputs[index], ctx.types[node.inputs[index]]
    if value.rank == 0:
        return name
    if value.size == 1:
        return build.add("Reshape", [name, build.const("scalar_shape", _int64(()))])
    length = operand.shape[-2 if row else -1] if operand.rank >= 2 else None
    if value.rank == 1 and value.shape[0] == length:
        if not row:
            return name
        return build.add("Reshape", [name, build.const("row_shape", _int64((length, 1)))])
    if value.rank == operand.rank and value.rank >= 2:
        return name
    raise ModelError(f"{label(node)}: input {index} ({what}) has shape {list(value.shape)}, "
                     f"expected a scalar, [{length}] or rank {operand.rank}")


def _scalar_input(build: Builder, index: int, what: str) -> str:
    node, ctx = build.node, build.ctx
    name, value = node.inputs[index], ctx.types[node.inputs[index]]
    if value.size != 1:
        raise ModelError(f"{label(node)}: input {index} ({what}) has shape "
                         f"{list(value.shape)}, expected a scalar (per-tensor)")
    if value.rank == 0:
        return name
    return build.add("Reshape", [name, build.const("scalar_shape", _int64(()))])


def _channel_input(build: Builder, index: int, channels: int, rank: int, axis: int,
                   what: str) -> str:
    """A conv scale, zero point or bias: a scalar, or [M] read along dim `axis` of a
    rank-`rank` tensor."""
    node, ctx = build.node, build.ctx
    value = ctx.types[node.inputs[index]]
    if value.size == 1:
        return _scalar_input(build, index, what)
    if value.shape != (channels,):
        raise ModelError(f"{label(node)}: input {index} ({what}) has shape "
                         f"{list(value.shape)}, expected a scalar or [{channels}]")
    dims = [1] * rank
    dims[axis] = channels
    return build.add("Reshape", [node.inputs[index],
                                 build.const("channel_shape", _int64(dims))])


def _shifted(build: Builder, value: str, dtype: str, zero: str | None, work: str) -> str:
    """Cast(value, work) - Cast(zero, work): the integer operand, exactly."""
    wide = build.add("Cast", [value], to=work)
    if zero is None:
        return wide
    return build.add("Sub", [wide, build.add("Cast", [zero], to=work)])


def _integer_matmul(build: Builder, a_at: int, b_at: int, a_zero: int | None,
                    b_zero: int | None, out: str | None = None) -> str:
    """The exact int32 product (a - a_zero) @ (b - b_zero) (see the docstring)."""
    node, ctx = build.node, build.ctx
    a, b = ctx.types[node.inputs[a_at]], ctx.types[node.inputs[b_at]]
    for index, t in ((a_at, a), (b_at, b)):
        _quantized(node, t.dtype, f"input {index}")
    zero_at = [at if at is not None and node.input(at) else None for at in (a_zero, b_zero)]
    for at, operand in zip(zero_at, (a, b)):
        if at is not None:
            _same_type(build, at, operand.dtype)
    if _native(ctx, node, a, b, zero_at, b.shape[-1] if b.rank == 2 else None):
        inputs = [node.inputs[a_at], node.inputs[b_at]] + \
            [_zero_input(build, at) for at in zero_at]
        return build.add("MatMulInteger", _trimmed(inputs), out=out)
    work = _product_dtype(a.shape[-1] if a.rank else 1, a.dtype, b.dtype)
    zeros = [_operand_zero_point(build, at, operand, row, "zero point") if at is not None
             else None for at, operand, row in zip(zero_at, (a, b), (True, False))]
    left = _shifted(build, node.inputs[a_at], a.dtype, zeros[0], work)
    right = _shifted(build, node.inputs[b_at], b.dtype, zeros[1], work)
    return build.add("Cast", [build.add("MatMul", [left, right])], out=out, to="int32")


def _native(ctx: Context, node: OnnxNode, a: TensorType, b: TensorType,
            zero_at: list, per_b: int | None) -> bool:
    """Whether the product is the catalogue's integer op (`hidetc.graph.ops.integer`):
    8-bit operands, a's zero point per tensor, b's per tensor or per `per_b` (columns /
    output channels); else the float decomposition (ONNX's per-row zero points, 16-bit
    operands)."""
    if a.dtype not in QUANTIZED[:2] or b.dtype not in QUANTIZED[:2]:
        return False
    sizes = [ctx.types[node.inputs[at]] if at is not None else None for at in zero_at]
    if sizes[0] is not None and sizes[0].size != 1:
        return False
    return sizes[1] is None or sizes[1].size == 1 or \
        (sizes[1].rank == 1 and sizes[1].shape[0] == per_b)


def _zero_input(build: Builder, at: int | None) -> str:
    """A zero point as the integer ops take it: omitted ("") where absent or a known
    zero (the kernels then skip its correction terms), a scalar where it has one
    element."""
    if at is None:
        return ""
    known = build.ctx.values.get(build.node.inputs[at])
    if known is not None and not np.any(known):
        return ""
    value = build.ctx.types[build.node.inputs[at]]
    if value.size == 1 and value.rank:
        return build.add("Reshape", [build.node.inputs[at],
                                     build.const("scalar_shape", _int64(()))])
    return build.node.inputs[at]


def _trimmed(inputs: list[str]) -> list[str]:
    while inputs and not inputs[-1]:
        inputs.pop()
    return inputs


def _same_type(build: Builder, index: int, dtype: str) -> None:
    have = build.ctx.types[build.node.inputs[index]].dtype
    if have != dtype:
        raise ModelError(f"{label(build.node)}: input {index} has type {have}, expected "
                         f"{dtype} (its operand's type)")


def _integer_conv(build: Builder, x_at: int, w_at: int, x_zero: int, w_zero: int,
                  out: str | None = None) -> str:
    """The exact int32 Conv(x - x_zero, w - w_zero) (see the docstring)."""
    node, ctx = build.node, build.ctx
    x, w = ctx.types[node.inputs[x_at]], ctx.types[node.inputs[w_at]]
    for index, t in ((x_at, x), (w_at, w)):
        _quantized(node, t.dtype, f"input {index}")
    if x.rank < 3 or w.rank != x.rank:
        raise ModelError(f"{label(node)}: inputs {x_at} and {w_at} have shapes "
                         f"{list(x.shape)} and {list(w.shape)}, expected the same rank >= 3")
    zero_at = [at if node.input(at) else None for at in (x_zero, w_zero)]
    for at, operand in zip(zero_at, (x, w)):
        if at is not None:
            _same_type(build, at, operand.dtype)
    attrs = {k: v for k, v in node.attrs.items() if k in CONV_ATTRS}
    if x.rank in (3, 4) and _native(ctx, node, x, w, zero_at, w.shape[0]):
        inputs = [node.inputs[x_at], node.inputs[w_at]] + \
            [_zero_input(build, at) for at in zero_at]
        if x.rank == 4:
            return build.add("ConvInteger", _trimmed(inputs), out=out, **attrs)
        return _integer_conv_1d(build, inputs, x, w, attrs, out)
    work = _product_dtype(math.prod(w.shape[1:]), x.dtype, w.dtype)
    zeros: list[str | None] = [None, None]
    if zero_at[0] is not None:
        zeros[0] = _scalar_input(build, x_zero, "x zero point")
    if zero_at[1] is not None:
        zeros[1] = _channel_input(build, w_zero, w.shape[0], w.rank, 0, "w zero point")
    left = _shifted(build, node.inputs[x_at], x.dtype, zeros[0], work)
    right = _shifted(build, node.inputs[w_at], w.dtype, zeros[1], work)
    return build.add("Cast", [build.add("Conv", [left, right], **attrs)], out=out, to="int32")


def _integer_conv_1d(build: Builder, inputs: list[str], x: TensorType, w: TensorType,
                     attrs: dict, out: str | None) -> str:
    """A 1-D ConvInteger as the 2-D one over [N, C, 1, W] (weights [OC, C/G, 1, KW],
    the window lifted, pads resolved), reshaped back: what the float Conv's import does
    (`spatial.conv`), for the 2-D integer kernels."""
    try:
        win = window_geometry("Conv", x.shape[2:], w.shape[2:], attrs)
    except ShapeError as error:
        raise ModelError(f"{label(build.node)}: {str(error).split(': ', 1)[-1]}") from None
    lifted = [build.add("Reshape", [name, build.const("shape_2d", _int64(shape))])
              for name, shape in ((inputs[0], x.shape[:2] + (1,) + x.shape[2:]),
                                  (inputs[1], w.shape[:2] + (1,) + w.shape[2:]))]
    y = build.add("ConvInteger", _trimmed(lifted + inputs[2:]),
                  kernel_shape=(1,) + tuple(w.shape[2:]), strides=(1,) + win.strides,
                  dilations=(1,) + win.dilations, pads=(0,) + win.begin + (0,) + win.end,
                  group=int(attrs.get("group", 1)))
    return build.add("Reshape", [y, build.const("shape_1d", _int64((x.shape[0], w.shape[0])
                                                                   + win.out))], out=out)


def _requantize(build: Builder, product: str, multiplier: str, zero_at: int,
                out_dtype: str) -> str:
    """Round(product * multiplier + y_zero_point) saturated to out_dtype, in float64."""
    node = build.node
    value = build.add("Mul", [build.add("Cast", [product], to="float64"),
                              build.add("Cast", [multiplier], to="float64")])
    if node.input(zero_at):
        _same_type(build, zero_at, out_dtype)
        zero = _scalar_input(build, zero_at, "y zero point")
        value = build.add("Add", [value, build.add("Cast", [zero], to="float64")])
    return _saturate(build, build.add("Round", [value]), "float64", out_dtype,
                     node.outputs[0])


def _multiplier(build: Builder, a_scale: str, b_scale: str, y_at: int, dtype: str) -> str:
    """a_scale * b_scale / y_scale in the scales' type."""
    _same_type(build, y_at, dtype)
    y_scale = _scalar_input(build, y_at, "y scale")
    return build.add("Div", [build.add("Mul", [a_scale, b_scale]), y_scale])


def matmul_integer(node: OnnxNode, ctx: Context) -> Converted:
    build = Builder(node, ctx)
    _integer_matmul(build, 0, 1, 2, 3, out=node.outputs[0])
    return build.done()


def conv_integer(node: OnnxNode, ctx: Context) -> Converted:
    build = Builder(node, ctx)
    _integer_conv(build, 0, 1, 2, 3, out=node.outputs[0])
    return build.done()


def qlinear_matmul(node: OnnxNode, ctx: Context) -> Converted:
    a, b = ctx.types[node.inputs[0]], ctx.types[node.inputs[3]]
    scale = ctx.types[node.inputs[1]].dtype
    out_dtype = _type(node, ctx, 7).dtype if node.input(7) else a.dtype
    _quantized(node, out_dtype, "input 7 (y_zero_point)")
    build = Builder(node, ctx)
    product = _integer_matmul(build, 0, 3, 2, 5)
    _same_type(build, 4, scale)
    a_scale = _operand_zero_point(build, 1, a, True, "a scale")
    b_scale = _operand_zero_point(build, 4, b, False, "b scale")
    _requantize(build, product, _multiplier(build, a_scale, b_scale, 6, scale), 7, out_dtype)
    return build.done()


def qlinear_conv(node: OnnxNode, ctx: Context) -> Converted:
    x, w = ctx.types[node.inputs[0]], ctx.types[node.inputs[3]]
    scale = ctx.types[node.inputs[1]].dtype
    out_dtype = _type(node, ctx, 7).dtype if node.input(7) else x.dtype
    _quantized(node, out_dtype, "input 7 (y_zero_point)")
    build = Builder(node, ctx)
    product = _integer_conv(build, 0, 3, 2, 5)
    if node.input(8):
        _same_type(build, 8, "int32")
        bias = _channel_input(build, 8, w.shape[0], x.rank, 1, "bias")
        product = build.add("Add", [build.add("Cast", [product], to="float64"),
                                    build.add("Cast", [bias], to="float64")])
    _same_type(build, 4, scale)
    x_scale = _scalar_input(build, 1, "x scale")
    w_scale = _channel_input(build, 4, w.shape[0], x.rank, 1, "w scale")
    _requantize(build, product, _multiplier(build, x_scale, w_scale, 6, scale), 7, out_dtype)
    return build.done()


HANDLERS = {
    "QuantizeLinear": quantize_linear,
    "DequantizeLinear": dequantize_linear,
    "DynamicQuantizeLinear": dynamic_quantize_linear,
    "MatMulInteger": matmul_integer,
    "ConvInteger": conv_integer,
    "QLinearMatMul": qlinear_matmul,
    "QLinearConv": qlinear_conv,
}
EXTRA_OPS = tuple(HANDLERS)
CHECKED = tuple(HANDLERS)
FIRST_VERSION = {op: 11 if op == "DynamicQuantizeLinear" else 10 for op in HANDLERS}
