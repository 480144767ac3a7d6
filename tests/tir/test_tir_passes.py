"""Per-pass before/after IR, idempotence, and semantics (the interpreter before == after)."""
import numpy as np
import pytest

from hidetc.tir.builder import KernelBuilder
from hidetc.tir.evaluate import run_function
from hidetc.tir.functor import collect
from hidetc.tir.ir import (
    Alloc,
    Buffer,
    Cast,
    Const,
    Declare,
    For,
    Function,
    If,
    Load,
    MapFor,
    Seq,
    Store,
    UnOp,
    Var,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    select,
)
from hidetc.tir.mapping import repeat, spatial
from hidetc.tir.passes.flatten_buffers import flatten_buffers
from hidetc.tir.passes.lower_mappings import lower_mappings
from hidetc.tir.passes.simplify import simplify, simplify_expr
from hidetc.tir.passes.verify import verify_function
from hidetc.tir.printer import format_expr, format_function

I32 = "int32"


def c(v, dtype=I32):
    return Const(v, dtype)


def mapped_kernel(m, name="k"):
    """out[task] = a[task] * 2 + worker, over all workers of mapping m (rank 1-3)."""
    kb = KernelBuilder(name)
    a = kb.buffer("a", "float32", m.task_shape)
    out = kb.buffer("out", "float32", m.task_shape)
    with kb.for_range(m.num_workers, name="w") as w:
        with kb.for_mapping(m, w) as idx:
            kb.store(out, idx, a[idx] * 2.0 + Cast(w, "float32"))
    return kb.finish()


def run(fn, *arrays):
    arrays = [x.copy() for x in arrays]
    run_function(fn, arrays)
    return arrays


def random_args(fn, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(p.shape).astype(p.dtype) for p in fn.params]


MAPPINGS = [spatial(16, 8), repeat(4, 1) * spatial(16, 8),
            spatial(2, 2) * repeat(2, 3) * spatial(4, 1), repeat(3) * spatial(5),
            spatial(2, 1, 3) * repeat(1, 2, 2), repeat(2, 1) * spatial(1, 1)]


# lower_mappings -----------------------------------------------------------------------
def test_lower_mappings_before_after():
    fn = mapped_kernel(repeat(4, 1) * spatial(16, 8))
    assert "repeat(4, 1)*spatial(16, 8).on(w)" in format_function(fn)
    low = lower_mappings(fn)
    assert format_function(low).splitlines()[1:] == [
        "    for w in range(128):",
        "        if w < 128:",
        "            for t0_ro0 in range(4):",
        "                out[t0_ro0 * 16 + w // 8, w % 8] = "
        "a[t0_ro0 * 16 + w // 8, w % 8] * 2.0 + float32(w)",
    ]
    verify_function(low, lowered=True)
    assert "if" not in format_function(simplify(low))  # the guard is proven


def test_lower_mappings_guards_extra_workers():
    kb = KernelBuilder("extra")
    out = kb.buffer("out", "float32", (8,))
    with kb.for_range(11, name="w") as w:  # 3 workers more than the mapping has
        with kb.for_mapping(repeat(2) * spatial(4), w % 6) as (i,):
            kb.store(out, (i,), out[i] + Cast(w, "float32"))
    fn = kb.finish()
    low = simplify(lower_mappings(fn))
    assert "if w % 6 < 4:" in format_function(low)
    zeros = np.zeros(8, np.float32)
    np.testing.assert_array_equal(run(fn, zeros)[0], run(low, zeros)[0])


@pytest.mark.parametrize("m", MAPPINGS, ids=str)
def test_lower_mappings_preserves_semantics(m):
    fn = mapped_kernel(m)
    low = lower_mappings(fn)
    verify_function(low, lowered=True)
    args = random_args(fn)
    before, after = run(fn, *args), run(low, *args)
    np.testing.assert_array_equal(before[1], after[1])
    # every task was written: out = a * 2 + owner, never the zero of an untouched cell
    assert not np.any(after[1] == 0)


def test_lower_mappings_is_identity_without_mapfor():
    low = lower_mappings(mapped_kernel(spatial(4)))
    assert lower_mappings(low) is low


def test_lower_mappings_nested_and_fresh_names():
    kb = KernelBuilder("nest")
    out = kb.buffer("out", "float32", (4, 6))
    taken = kb.declare("t0_ro0", I32, 0)  # collides with the name the pass would pick
    with kb.for_mapping(spatial(2) * repeat(2), 0) as (i,):
        with kb.for_mapping(repeat(3) * spatial(2), i % 2) as (j,):
            kb.store(out, (i, j), Cast(i * 10 + j + taken, "float32"))
    fn = kb.finish()
    low = lower_mappings(fn)
    verify_function(low, lowered=True)
    names = [v.name for v in collect(low).defined_vars]
    assert len(names) == len(set(names))
    np.testing.assert_array_equal(run(fn, np.zeros((4, 6), np.float32))[0],
                                  run(low, np.zeros((4, 6), np.float32))[0])


# flatten_buffers ----------------------------------------------------------------------
def test_flatten_before_after_and_idempotent():
    b3 = Buffer("b", "float32", (2, 3, 4))
    s = Buffer("s", "float32", ())
    i, j, k = Var("i"), Var("j"), Var("k")
    body = Seq((Store(b3, (i, j, k), Load(s, ())), Store(s, (), Load(b3, (c(1), j, k)))))
    fn = Function("f", (b3, s, i, j, k), body, (("target", "cpu"),))
    flat = flatten_buffers(fn)
    assert format_function(flat).splitlines()[1:] == [
        "    b[(i * 3 + j) * 4 + k] = s[0]",
        "    s[0] = b[(1 * 3 + j) * 4 + k]",
    ]
    assert flat.attr("flattened") is True
    assert flat.params == fn.params  # buffers keep their shape
    verify_function(flat, lowered=True)
    assert flatten_buffers(flat) is flat


def test_flatten_uses_int64_for_huge_or_symbolic_buffers():
    n, i, j = Var("n"), Var("i"), Var("j")
    big = Buffer("big", "float32", (65536, 65536))
    sym = Buffer("sym", "float32", (n, 4))
    fn = Function("f", (big, sym, n, i, j),
                  Seq((Store(big, (i, j), Load(sym, (i, j))),)), (("target", "cpu"),))
    text = format_function(flatten_buffers(fn))
    assert "big[int64(i) * int64(65536) + int64(j)]" in text
    assert "sym[int64(i) * int64(4) + int64(j)]" in text


# simplify: expressions ----------------------------------------------------------------
X, Y, Z = Var("x"), Var("y"), Var("z")
X64 = Var("x64", "int64")
F = Var("f", "float32")
B = Var("b", "bool")

EXPR_CASES = [
    (c(7) + c(5), "12"), (c(-7) // c(2), "-3"), (c(-7) % c(2), "-1"), (c(7) % c(-2), "1"),
    (c(7) / c(2), "3"), (c(7) // c(0), "7 // 0"), (c(2 ** 31 - 1) + c(1), "2147483647 + 1"),
    (minimum(c(3), c(-4)), "-4"), (X + 0, "x"), (c(0) + X, "x"), (X - 0, "x"), (X * 1, "x"),
    (X * 0, "0"), (X // 1, "x"), (X % 1, "0"), (X * 4 // 4, "x"), (X * 4 % 4, "0"),
    ((X + 1) + 2, "x + 3"), (c(3) + X, "x + 3"), ((X * 2) * 3, "x * 6"),
    ((X // 2) // 3, "x // 6"), (X64 + c(0), "x64"), (X + Const(0, "int64"), "int64(x)"),
    (F * 1.0, "f"), (F / 1.0, "f"), (F + 0.0, "f + 0.0"), (F * 0.0, "f * 0.0"),
    (logical_and(B, True), "b"), (logical_and(B, False), "False"),
    (logical_or(B, True), "True"), (logical_or(B, False), "b"),
    (logical_not(logical_not(B)), "b"), (logical_not(c(True, "bool")), "False"),
    (select(c(True, "bool"), F, 2.0), "f"), (select(c(False, "bool"), F, 2.0), "2.0"),
    (Cast(c(300), "int64"), "int64(300)"), (Cast(X, I32), "x"), (-c(5), "-5"),
    (c(3) < c(4), "True"),
]


@pytest.mark.parametrize("expr,expected", EXPR_CASES, ids=lambda v: str(v)[:40])
def test_simplify_expr(expr, expected):
    out = simplify_expr(expr)
    assert format_expr(out) == expected
    assert out.dtype == expr.dtype
    assert simplify_expr(out) is out


RANGES = {X: (0, 7), Y: (0, 3), Z: (-3, 3)}
RANGE_CASES = [
    (X // 8, "0"), (X % 8, "x"), (X % 5, "x % 5"), ((Y * 8 + X) // 8, "y"),
    ((Y * 8 + X) % 8, "x"), ((X + Y * 8) // 8, "y"), ((Y * 8 + X) // 4, "y * 2 + x // 4"),
    (Z // 8, "z // 8"), ((Y * 8 + Z) // 8, "(y * 8 + z) // 8"), (X < 8, "True"),
    (X < 7, "x < 7"), (X >= 0, "True"), (X > 7, "False"), (minimum(X, 10), "x"),
    (maximum(X, 10), "10"), ((Y * 8 + X) // 8 % 4, "y"),
]


@pytest.mark.parametrize("expr,expected", RANGE_CASES, ids=lambda v: str(v)[:40])
def test_simplify_with_ranges(expr, expected):
    assert format_expr(simplify_expr(expr, RANGES)) == expected


def test_simplify_without_ranges_keeps_division():
    assert format_expr(simplify_expr((Y * 8 + X) // 8)) == "(y * 8 + x) // 8"


# simplify: statements -----------------------------------------------------------------
OUT = Buffer("out", "int32", (16,))


def fn_body(*stmts):
    return Function("f", (OUT, X), Seq(tuple(stmts)), (("target", "cpu"),))


def lines(fn):
    return format_function(fn).splitlines()[1:]


def test_simplify_statements():
    i, k = Var("i"), Var("k")
    fn = fn_body(
        If(c(True, "bool"), Store(OUT, (c(0),), c(1))),
        If(c(False, "bool"), Store(OUT, (c(1),), c(1))),
        If(X < 3, Seq(()), Store(OUT, (c(2),), c(2))),
        For(i, c(0), Store(OUT, (i,), c(3))),
        For(i, c(1), Store(OUT, (i + 4,), i)),
        For(i, c(4), Seq(())),
        For(i, c(16), For(k, c(1), If(i < 16, Store(OUT, (i + k,), k)))),
    )
    out = simplify(fn)
    assert lines(out) == [
        "    out[0] = 1",
        "    if not (x < 3):",
        "        out[2] = 2",
        "    out[4] = 0",
        "    for i in range(16):",
        "        out[i] = 0",
    ]
    assert simplify(out) is out
    verify_function(out)


def test_simplify_keeps_declaring_blocks_scoped():
    i, v = Var("i"), Var("v")
    t = Buffer("t", "int32", (2,), "local")
    inner = Seq((Declare(v, c(5)), Alloc(t), Store(t, (c(0),), v), Store(OUT, (c(0),), v)))
    fn = fn_body(For(i, c(1), inner), Seq((Store(OUT, (c(1),), c(1)),)))
    out = simplify(fn)
    assert isinstance(out.body.stmts[0], Seq) and len(out.body.stmts) == 2
    verify_function(out)


def test_simplify_uses_mapfor_ranges():
    i = Var("i")
    fn = fn_body(MapFor((i,), repeat(8), c(0), Store(OUT, (i % 8,), i // 8)))
    assert lines(simplify(fn)) == ["    for i in repeat(8).on(0):", "        out[i] = 0"]


def test_simplify_empty_then_with_else_negates():
    fn = fn_body(If(X < 3, Seq(()), Store(OUT, (c(2),), c(2))))
    out = simplify(fn)
    assert isinstance(out.body, If) and isinstance(out.body.cond, UnOp)


@pytest.mark.parametrize("m", MAPPINGS, ids=str)
def test_simplify_preserves_semantics_and_is_idempotent(m):
    fn = flatten_buffers(lower_mappings(mapped_kernel(m)))
    out = simplify(fn)
    assert simplify(out) is out
    verify_function(out, lowered=True)
    args = random_args(fn, seed=1)
    np.testing.assert_array_equal(run(fn, *args)[1], run(out, *args)[1])
    assert "%" not in format_function(simplify(lower_mappings(mapped_kernel(spatial(4)))))
