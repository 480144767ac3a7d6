"""BitCast (opset 26): a value's bits read as another type of the same width.

Widths (`WIDTHS`): 64 float64/int64/uint64, 32 float32/int32/uint32, 16 float16/
bfloat16/int16/uint16, 8 int8/uint8/bool and the 8-bit floats (float8_*), 4 int4/uint4/
float4_e2m1fn, 2 int2/uint2. Storage as hidetc keeps it: bfloat16 is its 16 bits, a
narrow type its bits zero-extended in a byte (`narrow_types`), so between those and the
integers of their width the bits are the stored value; bool is one byte, 0 or 1, and a
byte read as bool is `byte != 0` (numpy's view keeps other bytes, which every consumer
reads as true).

`bitcast(x, dst)` builds the IR: integer <-> integer of one width (and bool) is a plain
Cast (C converts modulo 2^W: two's complement on gcc and nvcc); anything with a float
or a narrow type is `Call("bitcast", (x,), dst)`, which the printers write as the bits
of x (`hidetc_f2u`/`d2u`/`h2u` for float32/float64/float16, a cast to the unsigned type
of the width otherwise) read back as dst (`hidetc_u2f`/`u2d`/`u2h`, `!= 0` for bool, a
cast to dst's storage type otherwise): `bits_text`. The widths and the numpy reference
(`reference_bitcast`) live in `hidetc.graph.dtypes`, for the graph's rules.
"""
from __future__ import annotations

from typing import Callable

from hidetc.graph.dtypes import WIDTHS, reference_bitcast, width_mismatch
from hidetc.tir.ir import INTS, Call, Cast, Expr, cast

__all__ = ["WIDTHS", "FLOAT_BITS", "bitcast", "bits_text", "reference_bitcast",
           "width_mismatch"]

_INTEGERS = frozenset(INTS + ("bool",))
# float type -> (its bits as the unsigned integer of its width, those bits as it)
FLOAT_BITS = {"float32": ("hidetc_f2u", "hidetc_u2f"), "float64": ("hidetc_d2u", "hidetc_u2d"),
              "float16": ("hidetc_h2u", "hidetc_u2h")}


def bitcast(x: Expr, dst: str) -> Expr:
    """`x`'s bits as `dst`. A value of another width is a widened load (the CUDA rules
    compute float16 in float32: an exact Cast) and is read at its stored type."""
    while isinstance(x, Cast) and WIDTHS.get(x.dtype) != WIDTHS.get(dst):
        x = x.value
    if x.dtype == dst:
        return x
    if x.dtype in _INTEGERS and dst in _INTEGERS:
        return cast(x, dst)
    return Call("bitcast", (x,), dst)


def _storage_unsigned(dtype: str) -> str:
    return f"uint{max(WIDTHS[dtype], 8)}"


def bits_text(src: str, dst: str, value: str, ctype: Callable[[str], str]) -> str:
    """C/CUDA text of `value` (of `src`) bitcast to `dst`; `ctype` names the printer's
    storage type of a dtype."""
    unsigned = ctype(_storage_unsigned(src))
    to_bits = FLOAT_BITS.get(src, (None,))[0]
    bits = f"{to_bits}({value})" if to_bits else f"(({unsigned})({value}))"
    if dst in FLOAT_BITS:
        return f"{FLOAT_BITS[dst][1]}({bits})"
    if dst == "bool":
        return f"({bits} != 0)"
    return f"(({ctype(dst)}){bits})"
