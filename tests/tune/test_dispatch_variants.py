"""The dispatch of a compile for ranges (`hidetc.driver.dynamic`): builds recorded at
hint sizes with guards, added until every size of the ranges is covered, and the guards
read back exactly as the runtime evaluates them."""
from __future__ import annotations

import numpy as np
import pytest

from hidetc.driver import dynamic
from hidetc.errors import ConfigError
from hidetc.graph.dims import DimRange
from hidetc.graph.guards import Guard, guarded, hint_value
from hidetc.graph.ir import Graph, TensorType
from hidetc.graph.ops.shape import _clamped, _slice_length
from hidetc.graph.symbolic import SymbolicError, SymDim, assume

S, B = SymDim.symbol("seq"), SymDim.symbol("batch")


def _graph(**ranges: DimRange) -> Graph:
    """A graph whose only value is its input of the symbolic shape (a build receives it,
    or at a cell of one size the graph at that size)."""
    return Graph(("x",), ("x",), (), {"x": TensorType("float32", tuple(
        SymDim.symbol(n) for n in ranges))}, {}, "g", ranges)


class _FakePlan:
    """What plan_variants needs of a plan: its kernels by name."""

    def __init__(self, functions=None):
        self.functions = functions or {}
        self.launches = ()
        self.weights = {}


def test_guards_split_the_range_until_every_size_is_covered():
    """A build that takes one path below 16 and another from 16 (as the short-row
    reductions do), and one more below 4: one variant per interval around each tuning
    size (1, 8, 64, 512: 1..2, 3..22, 23..181, 182..512), the second split where its
    decisions split it, and every size of 1..512 served by the first variant whose
    guards hold there, built at a hint that took the same path."""
    def build(graph):
        (seq < 16) and (seq < 4)     # noqa: B015  (decisions a template makes)
        return _FakePlan()

    seq = S
    variants = dynamic.plan_variants(_graph(seq=DimRange(1, 512)), build)
    assert [v.hint["seq"] for v in variants[:4]] == [1, 8, 64, 512]
    assert len(variants) == 6      # 3..22 split at 4 and 16: 4..15, then 3, 16..22
    for size in range(1, 513):
        holding = [k for k, v in enumerate(variants)
                   if all(g.holds({"seq": size}) for g in v.guards)]
        assert holding, size
        path = (size < 16, size < 4 if size < 16 else None)
        first = variants[holding[0]]
        with guarded(first.hint):
            assert (first.hint["seq"] < 16, first.hint["seq"] < 4
                    if first.hint["seq"] < 16 else None) == path


def test_too_many_variants_is_a_one_line_error():
    def build(graph):
        with assume({"seq": (1, 512)}):
            for k in range(2, 80, 2):
                if S < k:          # a guard per even size: more variants than allowed
                    break
        return _FakePlan()

    with pytest.raises(ConfigError, match=r"^20 builds do not cover the ranges \(seq in "
                                          r"1..512; not covered: seq=\d+\): narrow a range$"):
        dynamic.plan_variants(_graph(seq=DimRange(1, 512)), build)


def test_uncovered_checks_every_size_of_two_ranges():
    ranges = {"batch": DimRange(1, 32), "seq": DimRange(1, 512)}
    wide = (Guard(S - 16, ">="),)
    narrow = (Guard(S - 16, "<"), Guard(B * S - 64, "<="))
    with assume(ranges):
        assert dynamic.uncovered(ranges, [wide]) == {"batch": 1, "seq": 1}
        assert dynamic.uncovered(ranges, [wide, narrow]) == {"batch": 5, "seq": 13}
        assert dynamic.uncovered(ranges, [wide, narrow, (Guard(S - 16, "<"),)]) is None


def test_guards_read_back_and_hold_vectorized():
    guard = Guard((S + 7) // 8 * 3 - B, ">")
    assert Guard.parse(str(guard)) == guard
    sizes = {"seq": np.arange(1, 50), "batch": np.full(49, 5)}
    np.testing.assert_array_equal(guard.holds(sizes),
                                  [((s + 7) // 8) * 3 - 5 > 0 for s in range(1, 50)])
    for bad in ("seq", "seq >= 1", "3 < 0", "seq << 0"):
        with pytest.raises(ValueError):
            Guard.parse(bad)


def test_heuristics_see_the_hint_and_record_nothing():
    with guarded({"seq": 40}) as guarding:
        assert hint_value(S * 2) == 80 and hint_value(7) == 7
    assert guarding.guards == []


@pytest.mark.parametrize("dim", [1, 2, 5, 9, 31])
def test_a_symbolic_slice_has_the_static_length_at_every_size(dim):
    """`_slice_length` over a symbolic dimension, evaluated at a size, is Python's
    slice length there, for forward and backward slices and every kind of bound."""
    checked = refused = 0
    with assume({"seq": (1, 40)}):
        for start in (-50, -3, -1, 0, 2, 7, 60, S, S - 1):
            for end in (-2 ** 63, -5, -1, 0, 3, 2 ** 62, S, S - 2):
                for step in (1, 2, 3, -1, -2):
                    try:
                        length = _slice_length(_clamped(start, end, step, S), S)
                    except SymbolicError:  # a bound the ranges cannot order: refused
                        refused += 1
                        continue
                    checked += 1
                    sizes = {"seq": dim}
                    at = [v.evaluate(sizes) if isinstance(v, SymDim) else v
                          for v in (start, end)]
                    want = len(range(*_clamped(at[0], at[1], step, dim).indices(dim)))
                    got = length.evaluate(sizes) if isinstance(length, SymDim) else length
                    assert got == want, (start, end, step, dim)
    assert checked >= 100      # (the rest: bounds a range of 1..40 cannot order)
