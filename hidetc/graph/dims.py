"""Sizes a dimension may take: one size, or a range of sizes with the sizes to tune at.

A `DimRange` is the closed interval `lo..hi` of positive sizes plus its tuning sizes
(`opts`, inside the interval). A static dimension is the range of one size
(`lo == hi`); DESIGN.md: "a static compile is the range of one size".

Text forms (what the CLI and the config take, and what manifests write):
    "128"        one size
    "1..512"     every size from 1 to 512
    dims "1x1..512" (a shape: one size or range per dimension, `x` or `,` between)

Guarantees: every parse error is a `ValueError` with a one-line message naming the text
and the form expected (callers prefix the flag or input); `default_opts` is deterministic
and depends only on the range.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

DEFAULT_OPT_COUNT = 4   # tuning sizes picked when none are given: spread in log scale,
                        # the range's minimum (batch 1: the latency case) and maximum too


@dataclass(frozen=True)
class DimRange:
    lo: int
    hi: int
    opts: tuple[int, ...] = ()

    def __post_init__(self):
        if not (isinstance(self.lo, int) and isinstance(self.hi, int)) or self.lo < 1 \
                or self.hi < self.lo:
            raise ValueError(f"a size range needs 1 <= lo <= hi, got {self.lo}..{self.hi}")
        for opt in self.opts:
            if not self.lo <= opt <= self.hi:
                raise ValueError(f"tuning size {opt} is outside the range {self}")
        if not self.opts:
            object.__setattr__(self, "opts", default_opts(self.lo, self.hi))
        else:
            object.__setattr__(self, "opts", tuple(sorted(set(self.opts))))

    @property
    def fixed(self) -> bool:
        """True for the range of one size (a static dimension)."""
        return self.lo == self.hi

    def __contains__(self, size: int) -> bool:
        return self.lo <= size <= self.hi

    def __str__(self) -> str:
        return str(self.lo) if self.fixed else f"{self.lo}..{self.hi}"

    def with_opts(self, opts: tuple[int, ...]) -> "DimRange":
        return DimRange(self.lo, self.hi, tuple(opts))

    def as_dict(self) -> dict:
        return {"min": self.lo, "max": self.hi, "opt": list(self.opts)}


def default_opts(lo: int, hi: int, count: int = DEFAULT_OPT_COUNT) -> tuple[int, ...]:
    """A few tuning sizes spread over `lo..hi` in log scale from `lo` (the smallest
    request, the latency case) to `hi` (the size whose kernels cost most): 1..512 ->
    (1, 8, 64, 512), 1..32 -> (1, 3, 10, 32); one size when the range is one."""
    if lo == hi:
        return (lo,)
    span = math.log(hi) - math.log(lo)
    picks = {min(hi, max(lo, round(math.exp(math.log(lo) + span * k / (count - 1)))))
             for k in range(count)}
    return tuple(sorted(picks))


def parse_size(text: str) -> DimRange:
    """"128" or "1..512" -> a DimRange (ValueError naming the text otherwise)."""
    text = text.strip()
    lo_text, sep, hi_text = text.partition("..")
    parts = [lo_text, hi_text] if sep else [lo_text]
    if not all(p.strip().isascii() and p.strip().isdigit() for p in parts):
        raise ValueError(f"{text!r}: expected a size (128) or a range of sizes (1..512)")
    lo = int(lo_text)
    hi = int(hi_text) if sep else lo
    if lo < 1 or hi < lo:
        raise ValueError(f"{text!r}: expected a size (128) or a range of sizes (1..512), "
                         f"positive, min <= max")
    return DimRange(lo, hi)


def parse_shape(text: str) -> list[DimRange]:
    """"1x1..512" (or "1,1..512") -> one DimRange per dimension."""
    parts = text.replace(",", "x").split("x") if text.strip() else []
    if not parts:
        raise ValueError(f"{text!r}: expected one size or range per dimension, "
                         f"e.g. 1x3x224x224 or 1x1..512")
    try:
        return [parse_size(p) for p in parts]
    except ValueError as error:
        raise ValueError(f"{text!r}: {error} in each dimension, e.g. 1x1..512") from None


def parse_sizes(text: str) -> tuple[int, ...]:
    """"16,64,128" -> (16, 64, 128): tuning sizes of one dimension."""
    parts = [p.strip() for p in text.split(",")]
    if not parts or not all(p.isascii() and p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"{text!r}: expected positive sizes separated by commas, "
                         f"e.g. 16,64,128")
    return tuple(int(p) for p in parts)


def parse_opt_shape(text: str) -> list[int]:
    """"1x128" -> [1, 128]: one tuning shape of an input, one size per dimension (several
    tuning shapes by repeating the flag)."""
    parts = text.split("x") if text.strip() else []
    if not parts or not all(p.strip().isascii() and p.strip().isdigit() and int(p) > 0
                            for p in parts):
        raise ValueError(f"{text!r}: expected one positive size per dimension, e.g. 1x128")
    return [int(p) for p in parts]
