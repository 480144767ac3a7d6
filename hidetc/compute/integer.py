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

BitShift (`bit_shift`) multiplies (LEFT) or divides (RIGHT) by 2^b in the unsigned type,
2^b built from b's low bits as a product of selects (log2(W) of them, exact); uint8 and
uint16 multiply in uint32 (C would promote them to a signed int, which may overflow)
and truncate back. A shift by b >= W gives 0; a negative signed value shifted right
is -1 - ((-1 - a) >> b) (arithmetic shift: -1 past the width), as numpy's shifts.
Integer Mod (`int_mod`): C's remainder (sign of the dividend) for fmod=1, plus the
divisor where the signs differ for Python's (fmod=0); a divisor of 0 gives 0 as numpy
does (the C remainder runs on 1 instead: no trap), and so does -1 (INT_MIN % -1 traps
on x86).

Integer Pow (`int_pow`) follows the reference: the power in float64 (`pow(double,
double)`), converted to the base's integer type; when the exponent is integral the
power is rounded to nearest first (the exact power is an integer, or below 1/2 in
magnitude for negative exponents, so a libm that is an ulp off, as CUDA's may be, still
gives the exact integer), otherwise truncated toward zero as the reference's astype
does. Results beyond 2^53 carry float64's rounding, as the reference's do.
"""
from __future__ import annotations

import numpy as np

from hidetc.tir.ir import Const, Expr, call, cast, eq, logical_and, logical_or, ne, select

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


def int_mod(a: Expr, b: Expr, python: bool) -> Expr:
    """a mod b for integers of one dtype: Python's sign (of b) when `python`, else C's."""
    dtype = a.dtype
    one = Const(1, dtype)
    if dtype.startswith("uint"):
        return a % select(eq(b, Const(0, dtype)), one, b)
    trivial = logical_or(eq(b, Const(0, dtype)), eq(b, Const(-1, dtype)))
    r = cast(a % select(trivial, one, b), dtype)
    if not python:
        return r
    zero = Const(0, dtype)
    differ = logical_and(ne(r, zero), ne(r < zero, b < zero))
    return select(differ, cast(r + b, dtype), r)


def _power_of_two(b: Expr, width: int, work: str) -> Expr:
    """2^b (in `work`) for 0 <= b < width, from the bits of b (unsigned)."""
    power: Expr = Const(1, work)
    k = 0
    while (1 << k) < width:
        bit = eq((b // Const(1 << k, b.dtype)) % Const(2, b.dtype), Const(1, b.dtype))
        power = power * select(bit, Const(1 << (1 << k), work), Const(1, work))
        k += 1
    return power


def bit_shift(a: Expr, b: Expr, direction: str) -> Expr:
    """a << b (direction "LEFT") or a >> b ("RIGHT", arithmetic for signed a), in a's
    dtype; shifts by b >= the width give 0 (-1 for a negative a shifted right)."""
    dtype = a.dtype
    u = _UNSIGNED[dtype]
    width = _bits(dtype)
    work = u if width >= 32 else "uint32"
    ub = cast(b, u)
    in_range = ub < Const(width, u)
    power = _power_of_two(ub, width, work)
    zero = Const(0, work)
    if direction == "LEFT":
        return cast(select(in_range, cast(a, work) * power, zero), dtype)
    if dtype == u:
        return cast(select(in_range, cast(a, work) // power, zero), dtype)
    nonneg = a >= Const(0, dtype)
    magnitude = select(nonneg, a, Const(-1, dtype) - a)   # >= 0, no overflow
    shifted = cast(select(in_range, cast(magnitude, work) // power, zero), dtype)
    return select(nonneg, shifted, Const(-1, dtype) - shifted)
