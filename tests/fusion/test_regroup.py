"""Reshape index maps by groups (`hidetc.compute.indexing.regroup`): the same element as
a row-major flatten-and-unflatten, at every index, for int and symbolic shapes; no
division by a run-time size where a symbolic dim passes through a reshape unchanged."""
import itertools

import numpy as np
import pytest

from hidetc.compute.indexing import regroup, reshape_groups
from hidetc.graph.symbolic import SymDim, evaluate
from hidetc.tir.evaluate import evaluate_expr
from hidetc.tir.ir import BinOp, Const, Var, size_expr, size_var

SEQ = SymDim.symbol("seq")


def _check(src, dst, sizes):
    src_n = [evaluate(d, sizes) for d in src]
    dst_n = [evaluate(d, sizes) for d in dst]
    assert int(np.prod(src_n)) == int(np.prod(dst_n))
    idx = [Var(f"i{d}", "int64") for d in range(len(src))]
    mapped = regroup(idx, src, dst)
    assert len(mapped) == len(dst)
    env = {size_var(name): value for name, value in sizes.items()}
    for point in itertools.islice(itertools.product(*map(range, src_n)), 0, None, 7):
        env.update(zip(idx, point))
        got = [evaluate_expr(e, env) for e in mapped]
        flat = np.ravel_multi_index(point, src_n) if src_n else 0
        want = list(np.unravel_index(flat, dst_n)) if dst_n else []
        assert got == [int(w) for w in want], (src, dst, point)


def _split(rng, n):
    """A random factorization of n into 1..4 factors, 1s sprinkled in."""
    dims = []
    while n > 1 and len(dims) < 3:
        f = [d for d in range(2, n + 1) if n % d == 0]
        d = int(rng.choice(f))
        dims.append(d)
        n //= d
    dims.append(n)
    for _ in range(int(rng.integers(0, 2))):
        dims.insert(int(rng.integers(0, len(dims) + 1)), 1)
    return dims


@pytest.mark.parametrize("seed", range(25))
def test_random_int_reshapes(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.choice([1, 6, 24, 60, 64, 90]))
    _check(_split(rng, n), _split(rng, n), {})


@pytest.mark.parametrize("src,dst", [
    ([1, SEQ, 12, 64], [1, SEQ, 768]),
    ([1, SEQ, 768], [1, SEQ, 12, 64]),
    ([12 * SEQ, 64], [1, 12, SEQ, 64]),
    ([SEQ, 12], [12, SEQ]),                    # no group closes early: one group
    ([2, SEQ, 3], [2 * SEQ * 3]),
    ([SEQ], [1, SEQ, 1]),
    ([SEQ * 4, 3], [SEQ, 12]),
])
@pytest.mark.parametrize("seq", [1, 2, 5])
def test_symbolic_reshapes(src, dst, seq):
    _check(src, dst, {"seq": seq})


def test_groups_keep_symbolic_dims_alone():
    assert [(list(a), list(b)) for a, b in reshape_groups([1, SEQ, 12, 64], [1, SEQ, 768])] \
        == [([0], [0]), ([1], [1]), ([2, 3], [2])]
    idx = [Var(f"i{d}", "int64") for d in range(4)]
    for e in regroup(idx, [1, SEQ, 12, 64], [1, SEQ, 768]):
        divisors = [b.b for b in _binops(e) if b.op in ("//", "%")]
        assert all(isinstance(d, Const) for d in divisors), e


def _binops(e):
    if isinstance(e, BinOp):
        yield e
        yield from _binops(e.a)
        yield from _binops(e.b)


def test_kernel_extents_match_graph_sizes():
    """A kernel buffer's extents (size Exprs) group with the graph's SymDims."""
    idx = [Var(f"i{d}", "int64") for d in range(3)]
    assert regroup(idx, [1, size_expr(SEQ), size_expr(SEQ)], [1, SEQ, SEQ])[1:] == idx[1:]
