"""C codegen + gcc: builder kernels -> lower -> C -> .so -> ctypes, compared with numpy."""
import ctypes
import math

import numpy as np
import pytest

from hidetc.backends.codegen import c as c_codegen
from hidetc.backends.codegen.c import MATH_FUNCTIONS, const_text, print_c_function, print_c_module
from hidetc.backends.toolchain.cache import BuildCache
from hidetc.backends.toolchain.gcc import build_shared_library
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.evaluate import run_function
from hidetc.tir.ir import (
    Buffer,
    Call,
    Const,
    Function,
    Seq,
    Store,
    Var,
    call,
    cast,
    maximum,
    minimum,
    select,
)
from hidetc.tir.mapping import repeat, spatial
from hidetc.tir.pipeline import lower

F32 = "float32"
UNARY = ["exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "erf",
         "tanh", "sinh", "cosh", "asinh", "acosh", "atanh", "abs", "floor", "ceil", "round",
         "trunc", "sin", "cos", "tan", "asin", "acos", "atan", "sigmoid"]
BINARY = ["pow", "atan2", "fmod"]
N = 64


def vadd():
    kb = KernelBuilder("vadd")
    n = kb.scalar("n")
    a, b, out = (kb.buffer(x, F32, (n,)) for x in ("a", "b", "out"))
    with kb.for_range((n + 127) // 128, kind="parallel", name="blk") as blk:
        with kb.for_range(32, name="w") as w:
            with kb.for_mapping(repeat(4) * spatial(32), w) as (i,):
                idx = blk * 128 + i
                with kb.if_then(idx < n):
                    kb.store(out, (idx,), a[idx] + b[idx])
    return kb.finish()


def transpose():
    kb = KernelBuilder("transpose")
    a = kb.buffer("a", F32, (16, 8))
    out = kb.buffer("out", F32, (8, 16))
    with kb.for_range(32, kind="parallel", name="w") as w:
        with kb.for_mapping(repeat(4, 1) * spatial(4, 8), w) as (i, j):
            kb.store(out, (j, i), a[i, j])
    return kb.finish()


def rowsum():
    kb = KernelBuilder("rowsum")
    a = kb.buffer("a", F32, (5, 37))
    out = kb.buffer("out", F32, (5,))
    with kb.for_range(5, kind="parallel", name="r") as r:
        acc = kb.declare("acc", F32, 0.0)
        with kb.for_range(37, name="k") as k:
            kb.assign(acc, acc + a[r, k])
        kb.store(out, (r,), acc)
    return kb.finish()


def branches():
    kb = KernelBuilder("branches")
    a, b = kb.buffer("a", F32, (N,)), kb.buffer("b", F32, (N,))
    leaky, sel = kb.buffer("leaky", F32, (N,)), kb.buffer("sel", F32, (N,))
    with kb.for_range(N, kind="unroll", name="i") as i:
        with kb.if_then(a[i] > 0.0):
            kb.store(leaky, (i,), a[i])
        with kb.otherwise():
            kb.store(leaky, (i,), a[i] * 0.1)
        kb.store(sel, (i,), select(a[i] < b[i], a[i], b[i] * 2.0))
    return kb.finish()


def math_kernel(dtype):
    kb = KernelBuilder(f"math_{dtype}")
    x, y = kb.buffer("x", dtype, (N,)), kb.buffer("y", dtype, (N,))
    out = kb.buffer("out", dtype, (len(UNARY) + len(BINARY) + 2, N))
    with kb.for_range(N, name="i") as i:
        for k, f in enumerate(UNARY):
            arg = x[i] + 1.0 if f == "acosh" else x[i]
            kb.store(out, (k, i), call(f, arg))
        for k, f in enumerate(BINARY, start=len(UNARY)):
            kb.store(out, (k, i), call(f, x[i], y[i]))
        kb.store(out, (len(UNARY) + len(BINARY), i), minimum(x[i], y[i]))
        kb.store(out, (len(UNARY) + len(BINARY) + 1, i), maximum(x[i], y[i]))
    return kb.finish()


def casts():
    kb = KernelBuilder("casts")
    x = kb.buffer("x", F32, (N,))
    xi = kb.buffer("xi", "int32", (N,))
    to_i32, to_i64 = kb.buffer("to_i32", "int32", (N,)), kb.buffer("to_i64", "int64", (N,))
    to_f32, to_bool = kb.buffer("to_f32", F32, (N,)), kb.buffer("to_bool", "bool", (N,))
    to_f64 = kb.buffer("to_f64", "float64", (N,))
    classes = kb.buffer("classes", "bool", (2, N))
    with kb.for_range(N, name="i") as i:
        kb.store(classes, (0, i), call("isnan", x[i], dtype="bool"))
        kb.store(classes, (1, i), call("isinf", cast(x[i], "float64"), dtype="bool"))
        kb.store(to_i32, (i,), cast(x[i], "int32") + cast(cast(x[i], "bool"), "int32"))
        kb.store(to_i64, (i,), cast(xi[i], "int64") * 3000000000)
        kb.store(to_f32, (i,), cast(xi[i], F32) + cast(x[i] > 0.0, F32))
        kb.store(to_bool, (i,), cast(x[i], "bool"))
        kb.store(to_f64, (i,), cast(cast(xi[i], "int64"), "float64") + cast(x[i], "float64"))
    return kb.finish()


def local_buffers():
    kb = KernelBuilder("local_buffers")
    a = kb.buffer("a", F32, (4, 8))
    rev = kb.buffer("rev", F32, (4, 8))
    big_out = kb.buffer("big_out", "int32", (20000,))
    with kb.for_range(4, kind="parallel", name="r") as r:
        t = kb.alloc("t", F32, (8,))
        wide = kb.alloc("wide", F32, (17000,))   # 68 KB: each worker's scratch stack
        with kb.for_range(8, name="k") as k:
            kb.store(t, (k,), a[r, k])
            kb.store(wide, (k * 2000,), a[r, k])
        with kb.for_range(8, name="k") as k:
            kb.store(rev, (r, k), t[7 - k] + wide[(7 - k) * 2000] - a[r, 7 - k])
    big = kb.alloc("big", "int32", (20000,))  # 80 KB: scratch stack, given back at the end
    big2 = kb.alloc("big2", "int32", (30000,))  # pushed above it (a fresh stack: malloc)
    with kb.for_range(20000, name="k") as k:
        kb.store(big, (k,), k * 2)
        kb.store(big2, (k + 10000,), k)
    with kb.for_range(20000, name="k") as k:
        kb.store(big_out, (k,), big[19999 - k] + 1 + big2[29999 - k] - (19999 - k))
    return kb.finish()


CONSTS = [0.1, 1 / 3, 1e-45, -0.0, math.inf, -math.inf, math.nan, 3.4e38, 16777217.0, -2.5]
INT64S = [2 ** 40, -2 ** 63, 2 ** 63 - 1, -1]


def constants():
    kb = KernelBuilder("constants")
    f32, f64 = kb.buffer("f32", F32, (len(CONSTS),)), kb.buffer("f64", "float64", (len(CONSTS),))
    i64, i32 = kb.buffer("i64", "int64", (len(INT64S),)), kb.buffer("i32", "int32", (2,))
    for k, v in enumerate(CONSTS):
        kb.store(f32, (k,), Const(v, F32))
        kb.store(f64, (k,), Const(v, "float64"))
    for k, v in enumerate(INT64S):
        kb.store(i64, (k,), Const(v, "int64"))
    kb.store(i32, (0,), Const(-2 ** 31, "int32"))
    kb.store(i32, (1,), -Const(-7, "int32") // 2 + Const(-7, "int32") % 3)
    return kb.finish()


def int_minmax():
    kb = KernelBuilder("int_minmax")
    a, b = kb.buffer("a", "int32", (N,)), kb.buffer("b", "int64", (N,))
    out = kb.buffer("out", "int64", (2, N))
    with kb.for_range(N, name="i") as i:
        kb.store(out, (0, i), minimum(cast(a[i], "int64"), b[i]))
        kb.store(out, (1, i), maximum(cast(a[i], "int64"), b[i]) + call("abs", b[i]))
    return kb.finish()


KERNELS = [vadd, transpose, rowsum, branches, lambda: math_kernel(F32),
           lambda: math_kernel("float64"), casts, local_buffers, constants, int_minmax]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("codegen")
    lowered = [lower(make()) for make in KERNELS]
    sources = {"part0": print_c_module(lowered[:5]), "part1": print_c_module(lowered[5:])}
    path = build_shared_library(sources, tmp / "kernels.so", cache=BuildCache(tmp / "cache"))
    return ctypes.CDLL(str(path)), {fn.name: fn for fn in lowered}


def test_runtime_extent_spans(tmp_path, monkeypatch):
    """A parallel loop of run-time extent taken in several spans (each a parallel region)
    runs every iteration once: the span shrunk to 3 blocks, n over 10 of them."""
    monkeypatch.setattr(c_codegen, "PARALLEL_SPAN", 3)
    src = print_c_module([lower(vadd())])
    assert "hidetc_base += 3LL" in src
    path = build_shared_library({"spans": src}, tmp_path / "spans.so",
                                cache=BuildCache(tmp_path / "cache"))
    so = ctypes.CDLL(str(path))
    for n in (0, 128 * 3, 1000, 1281):
        a, b, out = rand(n), rand(n), np.zeros(n, np.float32)
        so.vadd(ctypes.c_int32(n), *(ctypes.c_void_p(x.ctypes.data) for x in (a, b, out)))
        np.testing.assert_array_equal(out, a + b)


def invoke(lib, name, *args, interpret=True):
    so, fns = lib
    fn = fns[name]
    c_args = []
    for p, a in zip(fn.params, args):
        if isinstance(p, Buffer):
            assert a.flags.c_contiguous and a.dtype == np.dtype(p.dtype)
            c_args.append(ctypes.c_void_p(a.ctypes.data))
        else:
            c_args.append({"int32": ctypes.c_int32, "int64": ctypes.c_int64}[p.dtype](a))
    getattr(so, name)(*c_args)
    interp = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    if interpret and name != "local_buffers":  # the interpreter is slow on 40k iterations
        run_function(fn, interp)
    return interp


RNG = np.random.default_rng(42)


def rand(*shape, dtype=F32):
    return RNG.uniform(0.05, 0.95, shape).astype(dtype)


@pytest.mark.parametrize("n", [0, 1, 37, 128, 1000])
def test_vadd(lib, n):
    a, b, out = rand(n), rand(n), np.zeros(n, np.float32)
    ref = invoke(lib, "vadd", n, a, b, out)
    np.testing.assert_array_equal(out, a + b)
    np.testing.assert_array_equal(ref[3], out)


def test_transpose(lib):
    a, out = rand(16, 8), np.zeros((8, 16), np.float32)
    invoke(lib, "transpose", a, out)
    np.testing.assert_array_equal(out, a.T)


def test_rowsum(lib):
    a, out = rand(5, 37), np.zeros(5, np.float32)
    ref = invoke(lib, "rowsum", a, out)
    np.testing.assert_allclose(out, a.sum(axis=1), rtol=1e-6)
    np.testing.assert_array_equal(ref[1], out)  # same sequential float32 rounding


def test_branches(lib):
    a, b = RNG.standard_normal(N).astype(np.float32), rand(N)
    leaky, sel = np.zeros(N, np.float32), np.zeros(N, np.float32)
    invoke(lib, "branches", a, b, leaky, sel)
    np.testing.assert_array_equal(leaky, np.where(a > 0, a, a * np.float32(0.1)))
    np.testing.assert_array_equal(sel, np.where(a < b, a, b * np.float32(2)))


def _erf(x):
    return np.vectorize(math.erf)(x)


NUMPY = {"exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2,
         "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt,
         "rsqrt": lambda x: 1 / np.sqrt(x), "erf": _erf, "tanh": np.tanh, "sinh": np.sinh,
         "cosh": np.cosh, "asinh": np.arcsinh, "acosh": lambda x: np.arccosh(x + 1),
         "atanh": np.arctanh, "abs": np.abs, "floor": np.floor, "ceil": np.ceil,
         "round": np.rint, "trunc": np.trunc, "sin": np.sin, "cos": np.cos, "tan": np.tan,
         "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
         "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "pow": np.power, "atan2": np.arctan2,
         "fmod": np.fmod, "min": np.minimum, "max": np.maximum}


@pytest.mark.parametrize("dtype", [F32, "float64"])
@np.errstate(invalid="ignore")
def test_math_functions(lib, dtype):
    x = RNG.uniform(-0.95, 0.95, N).astype(dtype)
    x[::7] = np.array([0.5, 2.5, -1.5, 0.0, 1e-8, -0.75, 0.25, 0.9, -0.3, 0.1])[: len(x[::7])]
    y = RNG.uniform(0.5, 2.0, N).astype(dtype)
    x_pos = np.abs(x) + dtype_eps(dtype)
    names = UNARY + BINARY + ["min", "max"]
    out = np.zeros((len(names), N), dtype)
    invoke(lib, f"math_{dtype}", x, y, out)
    rtol = 4e-6 if dtype == F32 else 1e-13
    for k, f in enumerate(names):
        arg = x_pos if f in ("log", "log2", "log10", "sqrt", "rsqrt") else x
        if f in ("log", "log2", "log10", "sqrt", "rsqrt"):
            continue  # checked on positive inputs below
        want = (NUMPY[f](x, y) if f in BINARY + ["min", "max"] else NUMPY[f](arg))
        np.testing.assert_allclose(out[k], want.astype(dtype), rtol=rtol, atol=rtol, err_msg=f)
    out[:] = 0
    invoke(lib, f"math_{dtype}", x_pos, y, out)
    for f in ("log", "log2", "log10", "sqrt", "rsqrt"):
        want = NUMPY[f](x_pos).astype(dtype)
        np.testing.assert_allclose(out[names.index(f)], want, rtol=rtol, err_msg=f)


def dtype_eps(dtype):
    return np.finfo(dtype).eps


def test_math_table_covers_the_interpreter_and_tests():
    assert set(UNARY + BINARY + ["fma", "isnan", "isinf"]) == set(MATH_FUNCTIONS[F32])
    assert set(MATH_FUNCTIONS[F32]) == set(MATH_FUNCTIONS["float64"])
    assert MATH_FUNCTIONS[F32]["exp"] == "expf" and MATH_FUNCTIONS["float64"]["exp"] == "exp"
    assert MATH_FUNCTIONS["int64"]["abs"] == "llabs"


def test_min_max_propagate_nan(lib):
    x = np.array([np.nan, 1.0, 2.0, np.nan] + [0.5] * (N - 4), np.float32)
    y = np.array([1.0, np.nan, 3.0, np.nan] + [0.25] * (N - 4), np.float32)
    out = np.zeros((len(UNARY) + len(BINARY) + 2, N), np.float32)
    invoke(lib, "math_float32", x, y, out)
    np.testing.assert_array_equal(out[-2], np.minimum(x, y))
    np.testing.assert_array_equal(out[-1], np.maximum(x, y))


def test_casts(lib):
    x = RNG.uniform(-5, 5, N).astype(np.float32)
    x[:3] = [0.0, -0.0, 2.75]
    xi = RNG.integers(-1000, 1000, N).astype(np.int32)
    outs = [np.zeros(N, d) for d in ("int32", "int64", F32, "bool", "float64")]
    classes = np.zeros((2, N), bool)
    ref = invoke(lib, "casts", x, xi, *outs, classes)
    assert not classes.any()
    np.testing.assert_array_equal(outs[0], np.trunc(x).astype(np.int32) + (x != 0))
    np.testing.assert_array_equal(outs[1], xi.astype(np.int64) * 3000000000)
    np.testing.assert_array_equal(outs[2], xi.astype(np.float32) + (x > 0))
    np.testing.assert_array_equal(outs[3], x != 0)
    np.testing.assert_array_equal(outs[4], xi.astype(np.float64) + x.astype(np.float64))
    for got, want in zip(outs, ref[2:]):
        np.testing.assert_array_equal(got, want)
    special = np.array([np.nan, np.inf, -np.inf, 1.0] * (N // 4), np.float32)
    invoke(lib, "casts", special, xi, *outs, classes, interpret=False)  # int(nan): UB
    np.testing.assert_array_equal(classes, [np.isnan(special), np.isinf(special)])


def test_local_buffers(lib):
    """Stack arrays and scratch-stack buffers (two at once, the second one a malloc on
    the first call, from the grown stack after), in the calling thread and in OpenMP
    workers; the same results call after call, buffers given back in reverse order."""
    for n in range(3):
        a, rev = rand(4, 8), np.zeros((4, 8), np.float32)
        big_out = np.zeros(20000, np.int32)
        invoke(lib, "local_buffers", a, rev, big_out)
        np.testing.assert_array_equal(rev, a[:, ::-1], err_msg=f"call {n}")
        np.testing.assert_array_equal(big_out, np.arange(20000)[::-1] * 2 + 1,
                                      err_msg=f"call {n}")
    src = print_c_function(lower(local_buffers()))
    assert "float t[8] __attribute__((aligned(64)));" in src
    assert "hidetc_scratch_push(" in src and "malloc(" not in src
    assert src.index("hidetc_scratch_pop(hidetc_mem_big2);") < \
        src.index("hidetc_scratch_pop(hidetc_mem_big);")      # LIFO
    assert "& ~(uintptr_t)63);" in src  # 64-byte aligned


def test_constants_round_trip(lib):
    f32, f64 = np.zeros(len(CONSTS), np.float32), np.zeros(len(CONSTS), np.float64)
    i64, i32 = np.zeros(len(INT64S), np.int64), np.zeros(2, np.int32)
    invoke(lib, "constants", f32, f64, i64, i32)
    np.testing.assert_array_equal(f32, np.array(CONSTS, np.float32))
    np.testing.assert_array_equal(f64, np.array(CONSTS, np.float64))
    assert np.signbit(f32[3]) and np.signbit(f64[3])
    np.testing.assert_array_equal(i64, np.array(INT64S, np.int64))
    assert list(i32) == [-2 ** 31, 7 // 2 + (-1)]  # C: 7/2 = 3, -7 % 3 = -1


def test_int_minmax_abs(lib):
    a = RNG.integers(-100, 100, N).astype(np.int32)
    b = RNG.integers(-2 ** 40, 2 ** 40, N).astype(np.int64)
    out = np.zeros((2, N), np.int64)
    invoke(lib, "int_minmax", a, b, out)
    np.testing.assert_array_equal(out[0], np.minimum(a, b))
    np.testing.assert_array_equal(out[1], np.maximum(a, b) + np.abs(b))


def test_generated_source_shape():
    src = print_c_module([lower(vadd()), lower(rowsum())], prelude="/* prelude */")
    assert "#include <stdint.h>" in src and "#ifdef _OPENMP\n#include <omp.h>" in src
    assert src.index("/* prelude */") < src.index("void vadd(")
    assert ('__attribute__((visibility("default")))\nvoid vadd(int32_t n, '
            'const float *restrict a, const float *restrict b, float *restrict out)') in src
    assert "const int64_t hidetc_n = (n + 127) / 128;" in src  # vadd: a run-time extent
    assert "(uint64_t)hidetc_span / 16u);" in src
    assert "hidetc_par_init(&hidetc_par, 5u, 1u);" in src            # rowsum: extent 5
    assert "float acc = 0.0f;" in src
    assert "#pragma GCC unroll 64" in print_c_function(lower(branches()))


@pytest.mark.parametrize("value,dtype,text", [
    (1.0, F32, "1.0f"), (0.1, F32, "0.1f"), (1e20, F32, "1e+20f"), (-2.5, F32, "(-2.5f)"),
    (math.inf, F32, "INFINITY"), (-math.inf, F32, "(-INFINITY)"), (math.nan, F32, "NAN"),
    (0.1, "float64", "0.1"), (math.inf, "float64", "((double)INFINITY)"),
    (5, "int64", "5LL"), (-2 ** 63, "int64", "(-9223372036854775807LL - 1)"),
    (-2 ** 31, "int32", "(-2147483647 - 1)"), (7, "uint32", "7u"), (7, "int8", "((int8_t)7)"),
    (True, "bool", "true"),
])
def test_const_text(value, dtype, text):
    assert const_text(Const(value, dtype)) == text


def test_unsupported():
    kb = KernelBuilder("narrow")
    h = kb.buffer("h", "float32", (4,))
    o = kb.buffer("o", "float8_e4m3fn", (4,))
    with kb.for_range(4) as i:
        kb.store(o, (i,), cast(h[i], "float8_e4m3fn"))   # needs the ONNX Cast attributes
    with pytest.raises(NotImplementedError, match="narrow_types.convert"):
        print_c_function(lower(kb.finish()))
    with pytest.raises(ValueError, match="not lowered"):
        print_c_function(vadd())
    fn = Function("f", (Buffer("o", F32, (1,)),),
                  Seq((Store(Buffer("o", F32, (1,)), (Const(0, "int32"),),
                             Call("nosuch", (Const(1.0, F32),), F32)),)),
                  (("flattened", True), ("target", "cpu")))
    with pytest.raises(NotImplementedError, match="nosuch"):
        print_c_function(fn)
    with pytest.raises(ValueError, match="target cpu"):
        print_c_function(Function("g", (), Seq(()), (("flattened", True), ("target", "cuda"))))


def test_reserved_names_are_renamed():
    kb = KernelBuilder("names")
    buf = kb.buffer("float", F32, (4,))
    with kb.for_range(4, name="int") as i:
        kb.store(buf, (i,), buf[i] * 2.0)
    src = print_c_function(lower(kb.finish()))
    assert "float *restrict float_" in src and "int32_t int_ = 0" in src
    assert Var  # keeps the import list honest for readers of the IR constructors


def test_fma_is_fused(tmp_path):
    """fma(a, b, c) rounds once: exact against a float64 product plus c (rounded once)."""
    kb = KernelBuilder("fused")
    a, b, c, out = (kb.buffer(x, F32, (N,)) for x in ("a", "b", "c", "out"))
    with kb.for_range(N, name="i") as i:
        kb.store(out, (i,), call("fma", a[i], b[i], c[i]))
    fn = lower(kb.finish())
    lib = ctypes.CDLL(str(build_shared_library({"fused": print_c_module([fn])},
                                               tmp_path / "fused.so")))
    x, y, z = (RNG.standard_normal(N).astype(np.float32) for _ in range(3))
    out = np.zeros(N, np.float32)
    lib.fused(*(v.ctypes.data_as(ctypes.c_void_p) for v in (x, y, z, out)))
    want = (x.astype(np.float64) * y + z).astype(np.float32)
    np.testing.assert_array_equal(out, want)
    interp = np.zeros(N, np.float32)
    run_function(fn, [x, y, z, interp])
    np.testing.assert_array_equal(interp, want)


EXTENTS = (1, 2, 3, 5, 16, 17, 1000, 4099)


def counting(extent: int) -> Function:
    """out[i] += 1 for every i of a parallel loop of `extent` (read-modify-write: an
    iteration run twice or never shows)."""
    kb = KernelBuilder(f"count_{extent}")
    out = kb.buffer("out", "int32", (extent,))
    with kb.for_range(extent, kind="parallel", name="i") as i:
        kb.store(out, (i,), out[i] + 1)
    return kb.finish()


NESTED = """
#include <stdint.h>
void count_4099(int32_t *restrict out);
void count_nested(int32_t *out) {   /* inside a team: the kernel's own region gets 1 thread */
  #pragma omp parallel num_threads(2)
  {
    #pragma omp single
    count_4099(out);
  }
}
"""


def test_parallel_loops_run_every_iteration_once(tmp_path):
    """The shares-then-steal schedule (c_types.PARALLEL_SOURCE) on 1..7 threads, extents
    below and above the thread count, and a call from inside a parallel region (a team
    smaller than omp_get_max_threads, so one thread takes every share)."""
    sources = {"kernels": print_c_module([lower(counting(e)) for e in EXTENTS]),
               "nested": NESTED}
    so = ctypes.CDLL(str(build_shared_library(sources, tmp_path / "count.so",
                                              cache=BuildCache(tmp_path / "cache"))))
    for threads in (1, 2, 3, 7):
        so.omp_set_num_threads(threads)
        for e in EXTENTS:
            out = np.zeros(e, np.int32)
            for _ in range(3):
                getattr(so, f"count_{e}")(ctypes.c_void_p(out.ctypes.data))
            np.testing.assert_array_equal(out, 3, err_msg=f"{threads} threads, extent {e}")
        out = np.zeros(4099, np.int32)
        so.count_nested(ctypes.c_void_p(out.ctypes.data))
        np.testing.assert_array_equal(out, 1, err_msg=f"nested, {threads} threads")
