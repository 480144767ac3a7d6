"""The verifier accepts builder kernels and catches each kind of broken rule."""
import pytest

from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Alloc,
    Assign,
    Buffer,
    Const,
    Declare,
    For,
    Function,
    If,
    Load,
    MapFor,
    Select,
    Seq,
    Store,
    Var,
)
from hidetc.tir.mapping import repeat, spatial
from hidetc.tir.passes.verify import TirVerifyError, verify_function

A = Buffer("a", "float32", (4, 8))
OUT = Buffer("out", "float32", (4, 8))
VI, VJ = Var("i"), Var("j")
ZERO = Const(0, "int32")
F1 = Const(1.0, "float32")


def fn_of(*stmts, params=(A, OUT), **attrs):
    attrs.setdefault("target", "cpu")
    return Function("f", params, Seq(tuple(stmts)), tuple(sorted(attrs.items())))


def loop2(body):
    return For(VI, Const(4, "int32"), For(VJ, Const(8, "int32"), body))


def good():
    return fn_of(loop2(Store(OUT, (VI, VJ), Load(A, (VI, VJ)) + F1)))


def test_valid_functions_pass():
    verify_function(good())
    verify_function(good(), lowered=True)
    kb = KernelBuilder("k")
    n = kb.scalar("n")
    x = kb.buffer("x", "float32", (n,))
    with kb.for_range(n, kind="parallel") as w:
        t = kb.alloc("t", "float32", (4,))
        acc = kb.declare("acc", "float32", 0.0)
        with kb.for_mapping(repeat(4), 0) as (k,):
            kb.store(t, (k,), x[w])
            kb.assign(acc, acc + t[k])
        with kb.if_then(acc > 0.0):
            kb.store(x, (w,), acc)
        with kb.otherwise():
            kb.store(x, (w,), 0.0)
    verify_function(kb.finish())


BAD = {
    "used outside": fn_of(loop2(Store(OUT, (VI, VJ), F1)), Store(OUT, (VI, ZERO), F1)),
    "not a declared variable": fn_of(loop2(Assign(VJ, ZERO))),
    "not a declared variable ": fn_of(Assign(Var("x", "float32"), F1)),
    "has 1 indices, want 2": fn_of(loop2(Store(OUT, (VI,), F1))),
    "store of a float64 value": fn_of(loop2(Store(OUT, (VI, VJ), Const(1.0, "float64")))),
    "if condition has dtype int32": fn_of(loop2(If(VI, Store(OUT, (VI, VJ), F1)))),
    "select condition": fn_of(loop2(Store(OUT, (VI, VJ), Select(VJ, F1, F1)))),
    "neither a parameter nor allocated": fn_of(loop2(Store(OUT, (VI, VJ),
                                                           Load(Buffer("zz", "float32", (4, 8)),
                                                                (VI, VJ))))),
    "shared-scope buffer": fn_of(Alloc(Buffer("s", "float32", (4,), "shared"))),
    "defined again": fn_of(loop2(For(VI, Const(2, "int32"), Store(OUT, (VI, VJ), F1)))),
    "binds 1 variables, want 2": fn_of(MapFor((VI,), spatial(4, 8), ZERO,
                                              Store(OUT, (VI, ZERO), F1))),
    "an index of a has dtype float32": fn_of(loop2(Store(OUT, (VI, VJ), Load(A, (VI, F1))))),
    "parameter buffer s has scope": fn_of(params=(Buffer("s", "float32", (4,), "local"),)),
}


@pytest.mark.parametrize("message", sorted(BAD))
def test_catches(message):
    with pytest.raises(TirVerifyError, match=message.strip()):
        verify_function(BAD[message])


def test_mapfor_remaining_after_lowering():
    fn = fn_of(MapFor((VI, VJ), spatial(4, 8), ZERO, Store(OUT, (VI, VJ), F1)))
    verify_function(fn, lowered=False)
    with pytest.raises(TirVerifyError, match="remains after lowering"):
        verify_function(fn, lowered=True)


def test_alloc_scope_ends_with_its_block():
    t = Buffer("t", "float32", (4,), "local")
    block = Seq((Alloc(t), Store(t, (ZERO,), F1)))
    verify_function(fn_of(block))
    with pytest.raises(TirVerifyError, match="buffer t, which is neither"):
        verify_function(fn_of(block, Store(t, (ZERO,), F1)))


def test_declare_scope_ends_with_its_block():
    x = Var("x", "float32")
    block = Seq((Declare(x, F1),))
    with pytest.raises(TirVerifyError, match="variable x"):
        verify_function(fn_of(block, Store(OUT, (ZERO, ZERO), x)))


def test_flattened_functions_want_one_index():
    fn = fn_of(loop2(Store(OUT, (VI * 8 + VJ,), Load(A, (VI * 8 + VJ,)))), flattened=True)
    verify_function(fn, lowered=True)
    with pytest.raises(TirVerifyError, match="flattened buffer out"):
        verify_function(fn_of(loop2(Store(OUT, (VI, VJ), F1)), flattened=True))


def test_gpu_function_may_use_shared():
    verify_function(fn_of(Alloc(Buffer("s", "float32", (4,), "shared")), target="cuda"))


def test_not_a_function():
    with pytest.raises(TirVerifyError):
        verify_function(Seq(()))
