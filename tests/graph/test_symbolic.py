"""Symbolic sizes (`hidetc.graph.symbolic`): the arithmetic agrees with integer
arithmetic at every size, the text form reads back, and a decision is only ever made
when it holds over the whole of the symbols' ranges."""
from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from hidetc.graph.symbolic import SymbolicError, SymDim, assume, evaluate, parse, shape_array

S, B = SymDim.symbol("seq"), SymDim.symbol("batch")
SIZES = [dict(seq=s, batch=b) for s, b in itertools.product((1, 2, 7, 64, 97, 512), (1, 3, 32))]


def _expressions(seed: int, count: int = 300):
    """Random expressions built with the operations shape rules use, with the same
    operations applied to a function of the sizes (the oracle)."""
    rng = random.Random(seed)
    atoms = [(S, lambda z: z["seq"]), (B, lambda z: z["batch"])] + \
        [(k, (lambda k: lambda z: k)(k)) for k in (1, 2, 3, 8, 12, 64, 768)]
    pool = list(atoms)
    for _ in range(count):
        (a, fa), (b, fb) = rng.choice(pool), rng.choice(pool)
        op = rng.choice("+-*/%")
        if op == "+":
            made = (a + b, lambda z, fa=fa, fb=fb: fa(z) + fb(z))
        elif op == "-":
            made = (a - b, lambda z, fa=fa, fb=fb: fa(z) - fb(z))
        elif op == "*":
            made = (a * b, lambda z, fa=fa, fb=fb: fa(z) * fb(z))
        else:
            k = rng.choice((2, 3, 8, 64))
            made = ((a // k, lambda z, fa=fa, k=k: fa(z) // k) if op == "/" else
                    (a % k, lambda z, fa=fa, k=k: fa(z) % k))
        pool.append(made)
        yield made


@pytest.mark.parametrize("seed", range(4))
def test_arithmetic_matches_integers_at_every_size(seed):
    for expr, oracle in _expressions(seed):
        for sizes in SIZES:
            assert evaluate(expr, sizes) == oracle(sizes), (str(expr), sizes)
        if isinstance(expr, SymDim):
            back = parse(str(expr))
            for sizes in SIZES:
                assert evaluate(back, sizes) == oracle(sizes), (str(expr), str(back))


def test_canonical_forms_fold_and_divide():
    assert S + 0 == S and S * 1 == S and S - S == 0 and isinstance(S - S, int)
    assert 2 * S + 3 == 3 + S * 2 and hash(2 * S + 3) == hash(3 + S * 2)
    assert (B * S * 768) // (B * S) == 768 and ((B * S * 768) // (B * 12)) // 64 == S
    assert (S * 8 + 16) // 8 == S + 2 and (S * 8 + 16) % 8 == 0
    assert str((S + 7) // 8) == "((7 + seq)//8)" or str((S + 7) // 8) == "((seq + 7)//8)"
    assert S != 1 and not (S == 512) and S == SymDim.symbol("seq")
    for bad in (lambda: int(S), lambda: 5 // S, lambda: S // B, lambda: 3 / S,
                lambda: (S * 3) / 2, lambda: S // 0):
        with pytest.raises(SymbolicError):
            bad()
    assert shape_array([B, 3]).dtype == object and shape_array([2, 3]).dtype == np.int64


def test_decisions_hold_over_the_whole_range():
    """Every decided comparison holds at every size of the range (checked exhaustively
    over small ranges); undecided ones raise."""
    rng = random.Random(0)
    for expr, oracle in _expressions(7, 200):
        if not isinstance(expr, SymDim):
            continue
        lo_s, hi_s = sorted(rng.sample(range(1, 40), 2))
        lo_b, hi_b = sorted(rng.sample(range(1, 6), 2))
        values = [oracle(dict(seq=s, batch=b)) for s in range(lo_s, hi_s + 1)
                  for b in range(lo_b, hi_b + 1)]
        with assume({"seq": (lo_s, hi_s), "batch": (lo_b, hi_b)}):
            low, high = expr.bounds()
            assert low <= min(values) and high >= max(values), str(expr)
            for c in (-5, 0, 1, 17, 100):
                for op, check in (("<", lambda v: v < c), (">=", lambda v: v >= c),
                                  ("<=", lambda v: v <= c), (">", lambda v: v > c)):
                    try:
                        decided = {"<": expr < c, ">=": expr >= c, "<=": expr <= c,
                                   ">": expr > c}[op]
                    except SymbolicError:
                        continue
                    assert all(check(v) == decided for v in values), (str(expr), op, c)


def test_ranges_decide_what_sizes_alone_cannot():
    with pytest.raises(SymbolicError, match=r"whether seq <= 512 depends on the sizes "
                                            r"\(seq >= 1\)"):
        S <= 512
    with assume({"seq": (1, 512)}):
        assert S <= 512 and min(S, 1 << 62) == S and max(S - 1, 0) == S - 1
        with pytest.raises(SymbolicError, match=r"\(seq in 1..512\)"):
            S < 100
        with assume({"seq": (200, 300)}):
            assert S >= 100
    assert bool(S) and S > 0 and S - 1 >= 0
