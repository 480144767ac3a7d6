"""Integer definitions the IR has no operator for: bitwise logic and integer Pow.

The tensor-program IR (and so both printers) has arithmetic, comparisons and logic on
booleans but no bitwise operators, so the bitwise ops are computed arithmetically in
the unsigned type U of the operands' width (C converts signed <-> unsigned modulo 2^W,
which is two's complement on every target we build for, gcc and nvcc):

- `a & b = sum_k bit_k(a) * bit_k(b) * 2^k` with `bit_k(u) = (u // 2^k) % 2` (gcc and
  nvcc turn the power-of-two divisions into shifts), one term per bit of the width;
- `a | b = a + b - (a & b)` and `a ^ b = a + b - 2 (a & b)`, exact modulo 2^W;
- `~a = -1 - a` for signed types (no overflow for any a) and `U_MAX - a` for unsigned.
Results are exact for every input; the cost is O(W) operations per element (BitwiseAnd
on int64: 64 terms), acceptable for these rare ops. A native bitwise BinOp in the IR
and printers would make them one instruction.

Integer Pow (`int_pow`) follows the reference: the power in float64 (`pow(double,
double)`), converted to the base's integer type; when the exponent is integral the
power is rounded to nearest first (the exact power is an integer, or below 1/2 in
magnitude for negative exponents, so a libm that is an ulp off, as CUDA's may be, still
gives the exact integer), otherwise truncated toward zero as the reference's astype
does. Results beyond 2^53 carry float64's rounding, as the reference's do.
"""
from __future__ import annotations

import numpy as np

from hidetc.tir.ir import Const, Expr, call, cast, eq, select

_UNSIGNED = {"int8": "uint8", "int16": "uint16", "int32": "uint32", "int64": "uint64",
             "uint8": "uint8", "uint16": "uint16", "uint32": "uint32", "uint64": "uint64"}


def _bits(dtype: str) -> int:
    return np.iinfo(dtype).bits


def _bitwise_and_unsigned(a: Expr, b: Expr) -> Expr:
    u = a.dtype
    total: Expr | None = None
    for k in range(_bits(u)):
        p = Const(1 << k, u)
        two = Const(2, u)
        bit_a = (a // p) % two if k else a % two
        bit_b = (b // p) % two if k else b % two
        term = bit_a * bit_b * p if k else bit_a * bit_b
        total = term if total is None else total + term
    return total


def bitwise(op: str, a: Expr, b: Expr) -> Expr:
    """BitwiseAnd/Or/Xor of two integers of one dtype, in that dtype."""
    dtype = a.dtype
    u = _UNSIGNED[dtype]
    ua, ub = cast(a, u), cast(b, u)
    both = _bitwise_and_unsigned(ua, ub)
    if op == "BitwiseAnd":
        result = both
    elif op == "BitwiseOr":
        result = ua + ub - both
    else:
        result = ua + ub - both * Const(2, u)
    return cast(result, dtype)


def bitwise_not(x: Expr) -> Expr:
    if x.dtype.startswith("uint"):
        return cast(Const(int(np.iinfo(x.dtype).max), x.dtype) - x, x.dtype)
    return cast(Const(-1, x.dtype) - x, x.dtype)


def int_pow(a: Expr, b: Expr) -> Expr:
    """Pow with an integer base `a` (any numeric exponent `b`), in a's dtype."""
    wa, wb = cast(a, "float64"), cast(b, "float64")
    power = call("pow", wa, wb)
    integral = eq(call("floor", wb), wb)
    return cast(select(integral, call("round", power), power), a.dtype)
