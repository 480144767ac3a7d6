"""The generic rewriter, substitution, collection, and the IR printer."""
import pytest

from hidetc.tir.builder import KernelBuilder
from hidetc.tir.functor import Rewriter, all_names, collect, substitute
from hidetc.tir.ir import (
    Assign,
    BinOp,
    Buffer,
    Const,
    Declare,
    For,
    Seq,
    Store,
    Var,
    call,
    cast,
    eq,
    logical_and,
    logical_not,
    maximum,
    select,
)
from hidetc.tir.mapping import repeat, spatial
from hidetc.tir.printer import format_expr, format_function, format_stmt


def kernel():
    kb = KernelBuilder("k", target="cpu")
    n = kb.scalar("n")
    a = kb.buffer("a", "float32", (n, 8))
    out = kb.buffer("out", "float32", (n,))
    with kb.for_range(n, kind="parallel", name="w") as w:
        acc = kb.declare("acc", "float32", 0.0)
        with kb.for_mapping(repeat(2) * spatial(4), 0, names=["j"]) as (j,):
            kb.assign(acc, acc + a[w, j])
        kb.store(out, (w,), acc)
    return kb.finish()


def test_identity_rewriter_returns_same_objects():
    fn = kernel()
    assert Rewriter()(fn) is fn
    assert Rewriter()(fn.body) is fn.body


def test_rewriter_rebuilds_only_changed_path():
    class ConstToTwo(Rewriter):
        def visit_Const(self, e):
            return Const(2, e.dtype) if e.dtype == "int32" and e.value == 0 else e

    fn = kernel()
    new = ConstToTwo()(fn)
    assert new is not fn
    assert "on(2)" in format_function(new)
    assert new.params is fn.params


def test_rewriter_rejects_foreign_nodes():
    with pytest.raises(TypeError, match="not a TIR expression"):
        Rewriter().expr(3)


def test_substitute_uses_and_renames_definitions():
    i, j, n = Var("i"), Var("j"), Var("n")
    buf = Buffer("b", "int32", (10,))
    loop = For(i, n, Store(buf, (i,), i + n))
    assert substitute(loop, {}) is loop
    assert substitute(loop, {Var("zzz"): Const(1, "int32")}) is loop
    out = substitute(loop, {n: Const(10, "int32")})
    assert out == For(i, Const(10, "int32"), Store(buf, (i,), i + Const(10, "int32")))
    renamed = substitute(loop, {i: j})
    assert renamed.var == j and renamed.body == Store(buf, (j,), j + n)


def test_collect():
    fn = kernel()
    usage = collect(fn)
    assert usage.free_vars == ()
    assert [b.name for b in usage.loads] == ["a"]
    assert [b.name for b in usage.stores] == ["out"]
    assert {v.name for v in usage.defined_vars} == {"w", "acc", "j"}
    body_usage = collect(fn.body)
    assert {v.name for v in body_usage.free_vars} == {"n"}
    x = Var("x")
    assert collect(Seq((Assign(x, x + 1),))).free_vars == (x,)
    assert collect(Seq((Declare(x), Assign(x, x + 1)))).free_vars == ()
    assert {"n", "a", "out", "w", "acc", "j"} <= all_names(fn)


def test_format_function():
    text = format_function(kernel())
    assert text == (
        "def k(n: int32, a: float32[n, 8], out: float32[n]):  # target=cpu\n"
        "    for w in parallel(n):\n"
        "        acc: float32 = 0.0\n"
        "        for j in repeat(2)*spatial(4).on(0):\n"
        "            acc = acc + a[w, j]\n"
        "        out[w] = acc\n")


def test_format_expr_parentheses_and_constants():
    a, b, c = Var("a"), Var("b"), Var("c")
    assert format_expr(a - (b - c)) == "a - (b - c)"
    assert format_expr((a - b) - c) == "a - b - c"
    assert format_expr((a + b) * c) == "(a + b) * c"
    assert format_expr(-(a + b)) == "-(a + b)"
    assert format_expr(logical_not(logical_and(a < b, eq(b, c)))) == "not (a < b && b == c)"
    assert format_expr(maximum(a, 3)) == "max(a, 3)"
    assert format_expr(Const(3, "int64")) == "int64(3)"
    assert format_expr(cast(a, "float32")) == "float32(a)"
    assert format_expr(select(a < 1, 1.5, 2.5)) == "select(a < 1, 1.5, 2.5)"
    assert format_expr(call("exp", Const(1.0, "float32"))) == "exp(1.0)"
    assert format_expr(BinOp("*", Const(-2, "int32"), a)) == "-2 * a"
    assert format_expr(a * Const(-2, "int32")) == "a * -2"


def test_format_stmt_blocks():
    x = Var("x", "float32")
    buf = Buffer("t", "float32", (4,), "local")
    inner = Seq((Declare(x, Const(1.0, "float32")), Store(buf, (Const(0, "int32"),), x)))
    text = format_stmt(Seq((inner, Store(buf, (Const(1, "int32"),), Const(2.0, "float32")))))
    assert text.splitlines() == ["with block:", "    x: float32 = 1.0", "    t[0] = x",
                                 "t[1] = 2.0"]
    assert format_stmt(Seq(())) == "pass"
