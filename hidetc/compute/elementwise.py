"""Scalar definitions of elementwise ops: `UNARY[op](x, attrs)`, `BINARY[op](a, b)`.

Math follows numpy/ONNX: Relu/Max/Min propagate NaN (the printers' max/min do), Sigmoid
is 1 / (1 + exp(-x)), integer ops keep C semantics for non-negative operands. Sign keeps
0, -0 and NaN as they are (numpy's sign); IsNaN is `x != x`; IsInf compares with +-inf
per its detect_* attributes; Gelu is ONNX's formula (erf, or tanh with
approximate="tanh"). Bitwise ops and integer Pow are in `hidetc.compute.integer` (the
IR has no bitwise operators).

The activations follow the ONNX definitions, evaluated in the input's float dtype (the
numpy references compute in float64 and round, so results agree to a few ulps): Elu,
Celu and Selu use expm1 for e^x - 1 (no cancellation near 0), Mish is
x tanh(log1p(exp(x))) (log1p keeps the relative precision of its tiny results for
negative x), Round is rint (half to even, the default rounding mode). `BINARY_ATTR`
holds the binary ops that read attributes: Mod (integer fmod=0: the sign of the
divisor, as Python's %; fmod=1 and floats: C's fmod, the sign of the dividend; an
integer divisor of 0 gives 0, as numpy) and BitShift (`hidetc.compute.integer`).
"""
from __future__ import annotations

import math
from typing import Any, Callable

import onnx

from hidetc.compute import narrow_types
from hidetc.compute.bitcast import bitcast
from hidetc.compute.integer import bit_shift, bitwise, bitwise_not, int_mod, int_pow
from hidetc.tir.ir import (
    FLOATS,
    Const,
    Expr,
    as_expr,
    call,
    cast,
    eq,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    ne,
    select,
)

Unary = Callable[[Expr, dict[str, Any]], Expr]
Binary = Callable[[Expr, Expr], Expr]


def _math(func: str) -> Unary:
    return lambda x, attrs: call(func, x)


def _float(value: float, like: Expr) -> Expr:
    return as_expr(float(value), like) if like.dtype in FLOATS else as_expr(int(value), like)


def dtype_name(to: Any) -> str:
    """ONNX `to` attributes arrive as a TensorProto enum or already as a dtype name."""
    if isinstance(to, str):
        return to
    return str(onnx.helper.tensor_dtype_to_np_dtype(int(to)))


def _sigmoid(x: Expr, attrs: dict[str, Any]) -> Expr:
    one = _float(1.0, x)
    return one / (one + call("exp", -x))


def _leaky_relu(x: Expr, attrs: dict[str, Any]) -> Expr:
    return select(x < _float(0.0, x), x * _float(attrs.get("alpha", 0.01), x), x)


def _hard_sigmoid(x: Expr, attrs: dict[str, Any]) -> Expr:
    y = x * _float(attrs.get("alpha", 0.2), x) + _float(attrs.get("beta", 0.5), x)
    return minimum(maximum(y, _float(0.0, x)), _float(1.0, x))


def _sign(x: Expr, attrs: dict[str, Any]) -> Expr:
    one = _float(1.0, x)
    negative = select(x < _float(0.0, x), -one, x) if x.dtype not in _UNSIGNED else x
    return select(x > _float(0.0, x), one, negative)


def _gelu(x: Expr, attrs: dict[str, Any]) -> Expr:
    half, one = _float(0.5, x), _float(1.0, x)
    if attrs.get("approximate", "none") == "tanh":
        inner = x + _float(0.044715, x) * x * x * x
        return half * x * (one + call("tanh", _float(math.sqrt(2.0 / math.pi), x) * inner))
    return half * x * (one + call("erf", x * _float(1.0 / math.sqrt(2.0), x)))


def _isinf(x: Expr, attrs: dict[str, Any]) -> Expr:
    found = []
    if attrs.get("detect_positive", 1):
        found.append(eq(x, _float(math.inf, x)))
    if attrs.get("detect_negative", 1):
        found.append(eq(x, _float(-math.inf, x)))
    if not found:
        return Const(False, "bool")
    return found[0] if len(found) == 1 else logical_or(found[0], found[1])


def _pow(a: Expr, b: Expr) -> Expr:
    if a.dtype in FLOATS:
        return call("pow", a, cast(b, a.dtype))
    return int_pow(a, b)


def _elu(x: Expr, attrs: dict[str, Any]) -> Expr:
    alpha = _float(attrs.get("alpha", 1.0), x)
    return select(x < _float(0.0, x), alpha * call("expm1", x), x)


def _celu(x: Expr, attrs: dict[str, Any]) -> Expr:
    alpha = float(attrs.get("alpha", 1.0))
    zero = _float(0.0, x)
    negative = _float(alpha, x) * call("expm1", x / _float(alpha, x))
    return maximum(x, zero) + minimum(zero, negative)


def _selu(x: Expr, attrs: dict[str, Any]) -> Expr:
    alpha = _float(attrs.get("alpha", 1.67326319217681884765625), x)
    gamma = _float(attrs.get("gamma", 1.05070102214813232421875), x)
    return select(x > _float(0.0, x), gamma * x, gamma * (alpha * call("expm1", x)))


def _shrink(x: Expr, attrs: dict[str, Any]) -> Expr:
    bias = _float(attrs.get("bias", 0.0), x)
    lambd = float(attrs.get("lambd", 0.5))
    inner = select(x > _float(lambd, x), x - bias, _float(0.0, x))
    return select(x < _float(-lambd, x), x + bias, inner)


def _thresholded_relu(x: Expr, attrs: dict[str, Any]) -> Expr:
    return select(x > _float(attrs.get("alpha", 1.0), x), x, _float(0.0, x))


def _mish(x: Expr, attrs: dict[str, Any]) -> Expr:
    return x * call("tanh", call("log1p", call("exp", x)))


def _hard_swish(x: Expr, attrs: dict[str, Any]) -> Expr:
    gate = x * _float(1.0 / 6.0, x) + _float(0.5, x)
    return x * minimum(maximum(gate, _float(0.0, x)), _float(1.0, x))


def _mod(a: Expr, b: Expr, attrs: dict[str, Any]) -> Expr:
    if a.dtype in FLOATS:
        return a % b
    return int_mod(a, b, python=not attrs.get("fmod", 0))


_UNSIGNED = ("bool", "uint8", "uint16", "uint32", "uint64")

UNARY: dict[str, Unary] = {
    "Relu": lambda x, attrs: maximum(x, _float(0.0, x)),
    "Sigmoid": _sigmoid,
    "Tanh": _math("tanh"),
    "Erf": _math("erf"),
    "Sqrt": _math("sqrt"),
    "Exp": _math("exp"),
    "Log": _math("log"),
    "Abs": _math("abs"),
    "Floor": _math("floor"),
    "Ceil": _math("ceil"),
    "Sin": _math("sin"),
    "Cos": _math("cos"),
    "Neg": lambda x, attrs: -x,
    "Reciprocal": lambda x, attrs: _float(1.0, x) / x,
    "Not": lambda x, attrs: logical_not(x),
    "Identity": lambda x, attrs: x,
    "Dropout": lambda x, attrs: x,
    "Cast": lambda x, attrs: narrow_types.convert(x, dtype_name(attrs["to"]), attrs),
    "BitCast": lambda x, attrs: bitcast(x, dtype_name(attrs["to"])),
    "LeakyRelu": _leaky_relu,
    "HardSigmoid": _hard_sigmoid,
    "Softplus": lambda x, attrs: call("log", _float(1.0, x) + call("exp", x)),
    "Sign": _sign,
    "Gelu": _gelu,
    "IsNaN": lambda x, attrs: ne(x, x),
    "IsInf": _isinf,
    "BitwiseNot": lambda x, attrs: bitwise_not(x),
    "Tan": _math("tan"),
    "Asin": _math("asin"),
    "Acos": _math("acos"),
    "Atan": _math("atan"),
    "Sinh": _math("sinh"),
    "Cosh": _math("cosh"),
    "Asinh": _math("asinh"),
    "Acosh": _math("acosh"),
    "Atanh": _math("atanh"),
    "Round": _math("round"),
    "Softsign": lambda x, attrs: x / (_float(1.0, x) + call("abs", x)),
    "Shrink": _shrink,
    "Elu": _elu,
    "Celu": _celu,
    "Selu": _selu,
    "ThresholdedRelu": _thresholded_relu,
    "Mish": _mish,
    "HardSwish": _hard_swish,
}

BINARY: dict[str, Binary] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b,
    "Pow": _pow,
    "Max": maximum,
    "Min": minimum,
    "Equal": eq,
    "Less": lambda a, b: a < b,
    "LessOrEqual": lambda a, b: a <= b,
    "Greater": lambda a, b: a > b,
    "GreaterOrEqual": lambda a, b: a >= b,
    "And": logical_and,
    "Or": logical_or,
    "Xor": ne,
    "Sum": lambda a, b: a + b,
    **{op: (lambda a, b, op=op: bitwise(op, a, b))
       for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")},
}

BinaryAttr = Callable[[Expr, Expr, dict[str, Any]], Expr]
BINARY_ATTR: dict[str, BinaryAttr] = {
    "Mod": _mod,
    "BitShift": lambda a, b, attrs: bit_shift(a, b, attrs.get("direction", "")),
}
