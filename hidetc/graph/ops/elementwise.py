"""Elementwise ops: unary math and activations, binary and variadic broadcasting math,
comparisons and logic, Where, Clip, Cast, BitCast (`hidetc.compute.bitcast`).

Assumes: ONNX semantics (numpy multidirectional broadcasting). Guarantees: references
keep the input dtype (comparisons give bool); transcendental float functions are computed
in float64 and rounded back, so float32 results are correctly rounded up to one ulp.
Integer Div truncates toward zero (C semantics, as ONNX Runtime does). All are BIJECTIVE.
"""
from __future__ import annotations

import math
from typing import Callable

import numpy as np

from hidetc.graph.dtypes import reference_bitcast, reference_cast, width_mismatch
from hidetc.graph.ir import DTYPES, FLOAT_DTYPES, TensorType
from hidetc.graph.ops.common import (
    INTS,
    NUMERIC,
    SIGNED,
    arity,
    broadcast,
    dtype_in,
    fail,
    fmt,
    present,
    same_dtype,
    unidirectional,
)
from hidetc.graph.ops.registry import OpKind, define

Fn = Callable[..., np.ndarray]
_ERF = np.frompyfunc(math.erf, 1, 1)
_SQRT2 = math.sqrt(2.0)


def _wide(fn: Fn) -> Fn:
    """Compute a float function in float64 and round back to the input dtype."""
    def run(x: np.ndarray, attrs: dict) -> np.ndarray:
        if x.dtype == np.float64:
            return fn(x, attrs)
        return np.asarray(fn(x.astype(np.float64), attrs)).astype(x.dtype)
    return run


def _plain(fn: Callable[[np.ndarray], np.ndarray]) -> Fn:
    return lambda x, attrs: fn(x)


def _erf(x: np.ndarray) -> np.ndarray:
    return np.asarray(_ERF(x), dtype=np.float64)


def _gelu(x: np.ndarray, attrs: dict) -> np.ndarray:
    if attrs.get("approximate", "none") == "tanh":
        return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    return 0.5 * x * (1.0 + _erf(x / _SQRT2))


def _selu(x: np.ndarray, attrs: dict) -> np.ndarray:
    alpha = attrs.get("alpha", 1.67326319217681884765625)
    gamma = attrs.get("gamma", 1.05070102214813232421875)
    return np.where(x > 0, gamma * x, gamma * (alpha * np.exp(x) - alpha))


def _shrink(x: np.ndarray, attrs: dict) -> np.ndarray:
    bias, lambd = attrs.get("bias", 0.0), attrs.get("lambd", 0.5)
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0.0))


def _isinf(x: np.ndarray, attrs: dict) -> np.ndarray:
    neg, pos = attrs.get("detect_negative", 1), attrs.get("detect_positive", 1)
    return (np.isneginf(x) & bool(neg)) | (np.isposinf(x) & bool(pos))


def _relu(x: np.ndarray) -> np.ndarray:
    return np.maximum(x, np.zeros((), x.dtype))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


# name -> (function(x, attrs), allowed input dtypes, output dtype or None for "same")
UNARY: dict[str, tuple[Fn, tuple[str, ...], str | None]] = {
    "Relu": (_plain(_relu), SIGNED, None),
    "Neg": (_plain(np.negative), SIGNED, None),
    "Abs": (_plain(np.abs), NUMERIC, None),
    "Sign": (_plain(np.sign), NUMERIC, None),
    "Floor": (_plain(np.floor), FLOAT_DTYPES, None),
    "Ceil": (_plain(np.ceil), FLOAT_DTYPES, None),
    "Round": (_plain(np.round), FLOAT_DTYPES, None),
    "Reciprocal": (_wide(lambda x, a: 1.0 / x), FLOAT_DTYPES, None),
    "Sqrt": (_wide(lambda x, a: np.sqrt(x)), FLOAT_DTYPES, None),
    "Exp": (_wide(lambda x, a: np.exp(x)), FLOAT_DTYPES, None),
    "Log": (_wide(lambda x, a: np.log(x)), FLOAT_DTYPES, None),
    "Tanh": (_wide(lambda x, a: np.tanh(x)), FLOAT_DTYPES, None),
    "Sigmoid": (_wide(lambda x, a: 1.0 / (1.0 + np.exp(-x))), FLOAT_DTYPES, None),
    "Erf": (_wide(lambda x, a: _erf(x)), FLOAT_DTYPES, None),
    "Sin": (_wide(lambda x, a: np.sin(x)), FLOAT_DTYPES, None),
    "Cos": (_wide(lambda x, a: np.cos(x)), FLOAT_DTYPES, None),
    "Tan": (_wide(lambda x, a: np.tan(x)), FLOAT_DTYPES, None),
    "Asin": (_wide(lambda x, a: np.arcsin(x)), FLOAT_DTYPES, None),
    "Acos": (_wide(lambda x, a: np.arccos(x)), FLOAT_DTYPES, None),
    "Atan": (_wide(lambda x, a: np.arctan(x)), FLOAT_DTYPES, None),
    "Sinh": (_wide(lambda x, a: np.sinh(x)), FLOAT_DTYPES, None),
    "Cosh": (_wide(lambda x, a: np.cosh(x)), FLOAT_DTYPES, None),
    "Asinh": (_wide(lambda x, a: np.arcsinh(x)), FLOAT_DTYPES, None),
    "Acosh": (_wide(lambda x, a: np.arccosh(x)), FLOAT_DTYPES, None),
    "Atanh": (_wide(lambda x, a: np.arctanh(x)), FLOAT_DTYPES, None),
    "Softplus": (_wide(lambda x, a: _softplus(x)), FLOAT_DTYPES, None),
    "Softsign": (_wide(lambda x, a: x / (1.0 + np.abs(x))), FLOAT_DTYPES, None),
    "Mish": (_wide(lambda x, a: x * np.tanh(_softplus(x))), FLOAT_DTYPES, None),
    "Gelu": (_wide(_gelu), FLOAT_DTYPES, None),
    "LeakyRelu": (_wide(lambda x, a: np.where(x < 0, a.get("alpha", 0.01) * x, x)),
                  FLOAT_DTYPES, None),
    "Elu": (_wide(lambda x, a: np.where(x < 0, a.get("alpha", 1.0) * np.expm1(x), x)),
            FLOAT_DTYPES, None),
    "Celu": (_wide(lambda x, a: np.maximum(x, 0.0) + np.minimum(
        0.0, a.get("alpha", 1.0) * np.expm1(x / a.get("alpha", 1.0)))), FLOAT_DTYPES, None),
    "Selu": (_wide(_selu), FLOAT_DTYPES, None),
    "ThresholdedRelu": (_wide(lambda x, a: np.where(x > a.get("alpha", 1.0), x, 0.0)),
                        FLOAT_DTYPES, None),
    "HardSigmoid": (_wide(lambda x, a: np.clip(a.get("alpha", 0.2) * x + a.get("beta", 0.5),
                                               0.0, 1.0)), FLOAT_DTYPES, None),
    "HardSwish": (_wide(lambda x, a: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)), FLOAT_DTYPES, None),
    "Shrink": (_wide(_shrink), FLOAT_DTYPES, None),
    "Not": (_plain(np.logical_not), ("bool",), None),
    "BitwiseNot": (_plain(np.invert), INTS, None),
    "IsNaN": (_plain(np.isnan), FLOAT_DTYPES, "bool"),
    "IsInf": (_isinf, FLOAT_DTYPES, "bool"),
}


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f" or a.dtype.name == "bfloat16":   # ml_dtypes' kind is "V"
        return np.divide(a, b)
    quotient = np.floor_divide(a, b)
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return (quotient + fix).astype(quotient.dtype)


def _mod(a: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    return np.fmod(a, b) if attrs.get("fmod", 0) else np.mod(a, b)


def _pow(a: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    return np.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)


def _bitshift(a: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    if attrs.get("direction") == "LEFT":
        return np.left_shift(a, b)
    return np.right_shift(a, b)


def _two(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[..., np.ndarray]:
    return lambda a, b, attrs: fn(a, b)


# name -> (function(a, b, attrs), allowed dtypes, output dtype or None for "same",
#          whether input 1 may have its own dtype)
BINARY: dict[str, tuple[Callable[..., np.ndarray], tuple[str, ...], str | None, bool]] = {
    "Add": (_two(np.add), NUMERIC, None, False),
    "Sub": (_two(np.subtract), NUMERIC, None, False),
    "Mul": (_two(np.multiply), NUMERIC, None, False),
    "Div": (_two(_int_div), NUMERIC, None, False),
    "Pow": (_pow, NUMERIC, None, True),
    "Mod": (_mod, NUMERIC, None, False),
    "BitShift": (_bitshift, INTS, None, False),
    "Equal": (_two(np.equal), DTYPES, "bool", False),
    "Less": (_two(np.less), NUMERIC, "bool", False),
    "LessOrEqual": (_two(np.less_equal), NUMERIC, "bool", False),
    "Greater": (_two(np.greater), NUMERIC, "bool", False),
    "GreaterOrEqual": (_two(np.greater_equal), NUMERIC, "bool", False),
    "And": (_two(np.logical_and), ("bool",), None, False),
    "Or": (_two(np.logical_or), ("bool",), None, False),
    "Xor": (_two(np.logical_xor), ("bool",), None, False),
    "BitwiseAnd": (_two(np.bitwise_and), INTS, None, False),
    "BitwiseOr": (_two(np.bitwise_or), INTS, None, False),
    "BitwiseXor": (_two(np.bitwise_xor), INTS, None, False),
}

# name -> (numpy reduction over stacked operands, allowed dtypes)
VARIADIC: dict[str, tuple[Callable[[list[np.ndarray]], np.ndarray], tuple[str, ...]]] = {
    "Max": (lambda xs: _fold(np.maximum, xs), NUMERIC),
    "Min": (lambda xs: _fold(np.minimum, xs), NUMERIC),
    "Sum": (lambda xs: _fold(np.add, xs), FLOAT_DTYPES),
    "Mean": (lambda xs: (_fold(np.add, xs) / len(xs)).astype(xs[0].dtype), FLOAT_DTYPES),
}


def _fold(fn: Callable[[np.ndarray, np.ndarray], np.ndarray], xs: list[np.ndarray]) -> np.ndarray:
    result = xs[0]
    for x in xs[1:]:
        result = fn(result, x)
    return np.broadcast_to(result, broadcast("", [x.shape for x in xs])).copy()


def _unary_infer(name: str, allowed: tuple[str, ...], out: str | None):
    def infer(types, attrs, values):
        arity(name, types, 1)
        dtype = dtype_in(name, types, 0, allowed)
        if name == "Gelu" and attrs.get("approximate", "none") not in ("none", "tanh"):
            fail(name, f"approximate={attrs['approximate']!r}, expected 'none' or 'tanh'")
        return [TensorType(out or dtype, types[0].shape)]
    return infer


def _unary_ref(fn: Fn, out: str | None):
    def reference(inputs, attrs):
        result = np.asarray(fn(inputs[0], attrs))
        return [result.astype(out or inputs[0].dtype, copy=False)]
    return reference


def _binary_infer(name: str, allowed: tuple[str, ...], out: str | None, mixed: bool):
    def infer(types, attrs, values):
        arity(name, types, 2)
        dtype = dtype_in(name, types, 0, allowed)
        if mixed:
            dtype_in(name, types, 1, allowed)
        else:
            same_dtype(name, types, [0, 1])
        if name == "Mod" and dtype in FLOAT_DTYPES and not attrs.get("fmod", 0):
            fail(name, f"input 0 has dtype {dtype}: float Mod requires fmod=1")
        if name == "BitShift" and attrs.get("direction") not in ("LEFT", "RIGHT"):
            fail(name, f"direction={attrs.get('direction')!r}, expected 'LEFT' or 'RIGHT'")
        shape = broadcast(name, [types[0].shape, types[1].shape])
        return [TensorType(out or dtype, shape)]
    return infer


def _binary_ref(fn: Callable[..., np.ndarray], out: str | None):
    def reference(inputs, attrs):
        result = np.asarray(fn(inputs[0], inputs[1], attrs))
        return [result.astype(out or inputs[0].dtype, copy=False)]
    return reference


def _variadic_infer(name: str, allowed: tuple[str, ...]):
    def infer(types, attrs, values):
        arity(name, types, 1, 1 << 16)
        dtype = dtype_in(name, types, 0, allowed)
        same_dtype(name, types, list(range(len(types))))
        return [TensorType(dtype, broadcast(name, [t.shape for t in types]))]
    return infer


def _variadic_ref(fn: Callable[[list[np.ndarray]], np.ndarray]):
    return lambda inputs, attrs: [np.asarray(fn(list(inputs))).astype(inputs[0].dtype)]


def _where_infer(types, attrs, values):
    arity("Where", types, 3)
    dtype_in("Where", types, 0, ("bool",))
    dtype = same_dtype("Where", types, [1, 2])
    return [TensorType(dtype, broadcast("Where", [t.shape for t in types]))]


def _where_ref(inputs, attrs):
    return [np.where(inputs[0], inputs[1], inputs[2]).astype(inputs[1].dtype, copy=False)]


def _clip_infer(types, attrs, values):
    arity("Clip", types, 1, 3)
    dtype_in("Clip", types, 0, NUMERIC)
    for i in (1, 2):
        if present(types, i):
            same_dtype("Clip", types, [0, i])
            if types[i].size != 1:
                fail("Clip", f"input {i} has shape {fmt(types[i].shape)}, expected a scalar")
    return [types[0]]


def _clip_ref(inputs, attrs):
    x = inputs[0]
    low = inputs[1] if len(inputs) > 1 else None
    high = inputs[2] if len(inputs) > 2 else None
    if low is not None:
        x = np.maximum(x, low.reshape(()))
    if high is not None:
        x = np.minimum(x, high.reshape(()))
    return [np.asarray(x, dtype=inputs[0].dtype)]


def _prelu_infer(types, attrs, values):
    arity("PRelu", types, 2)
    dtype = dtype_in("PRelu", types, 0, SIGNED)
    same_dtype("PRelu", types, [0, 1])
    unidirectional("PRelu", types[0].shape, types[1].shape, 1)
    return [TensorType(dtype, types[0].shape)]


def _prelu_ref(inputs, attrs):
    x, slope = inputs
    return [np.where(x < 0, x * slope, x).astype(x.dtype, copy=False)]


def _cast_infer(types, attrs, values):
    arity("Cast", types, 1)
    to = attrs.get("to")
    if to not in DTYPES:
        fail("Cast", f"attribute to={to!r} is not a supported dtype")
    return [TensorType(to, types[0].shape)]


def _cast_ref(inputs, attrs):
    return [reference_cast(inputs[0], attrs["to"], bool(attrs.get("saturate", 1)),
                           str(attrs.get("round_mode", "up")))]


def _bitcast_infer(types, attrs, values):
    arity("BitCast", types, 1)
    to = attrs.get("to")
    if to not in DTYPES:
        fail("BitCast", f"attribute to={to!r} is not a supported dtype")
    why = width_mismatch(types[0].dtype, to)
    if why:
        fail("BitCast", why)
    return [TensorType(to, types[0].shape)]


def _bitcast_ref(inputs, attrs):
    return [reference_bitcast(inputs[0], attrs["to"])]


def _register() -> None:
    for name, (fn, allowed, out) in UNARY.items():
        define(name, OpKind.BIJECTIVE, _unary_infer(name, allowed, out), _unary_ref(fn, out))
    for name, (fn, allowed, out, mixed) in BINARY.items():
        define(name, OpKind.BIJECTIVE, _binary_infer(name, allowed, out, mixed),
               _binary_ref(fn, out))
    for name, (fn, allowed) in VARIADIC.items():
        define(name, OpKind.BIJECTIVE, _variadic_infer(name, allowed), _variadic_ref(fn))
    define("Where", OpKind.BIJECTIVE, _where_infer, _where_ref)
    define("Clip", OpKind.BIJECTIVE, _clip_infer, _clip_ref)
    define("PRelu", OpKind.BIJECTIVE, _prelu_infer, _prelu_ref)
    define("Cast", OpKind.BIJECTIVE, _cast_infer, _cast_ref)
    define("BitCast", OpKind.BIJECTIVE, _bitcast_infer, _bitcast_ref)


_register()
