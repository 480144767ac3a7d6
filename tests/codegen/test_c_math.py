"""The cpu target's vectorizable float32 math (hidetc/backends/codegen/c_math.py), through the C
printer: float32 exp/tanh/erf/log/sigmoid print as the inline helpers (float64 and the
CUDA table keep libm), a loop calling each compiles to AVX2 code with no libm call,
and each is within its ulp bound of float64 numpy over ~1e6 points spanning the
interesting ranges (tiny, denormal, large, the overflow/underflow edges) and exact on
the special values."""
from __future__ import annotations

import ctypes
import math
import re
import subprocess

import numpy as np
import pytest

from hidetc.backends.codegen.c import MATH_FUNCTIONS, print_c_module
from hidetc.backends.codegen.c_math import FAST_FLOAT32
from hidetc.backends.codegen.cuda import print_cuda_function
from hidetc.backends.toolchain.gcc import build_shared_library, find_compiler, host_flags
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import call, thread_idx
from hidetc.tir.pipeline import lower

F32 = "float32"
N = 1 << 20
FUNCS = ("exp", "tanh", "erf", "log", "sigmoid")
# max error in ulp of the float64 result (the denormal step below the normal range),
# asserted here; measured exhaustively over all 2^32 inputs: see c_math's docstring.
# sigmoid is the IR's 1 / (1 + exp(-x)): exp's error plus two roundings
ULP_BOUND = {"exp": 1.0, "tanh": 1.5, "erf": 1.5, "log": 1.0, "sigmoid": 3.0}


def kernel(func: str, dtype: str = F32, n: int = N):
    kb = KernelBuilder(f"v_{func}_{dtype}", "cpu")
    x, y = kb.buffer("x", dtype, (n,)), kb.buffer("y", dtype, (n,))
    with kb.for_range(n, name="i") as i:
        kb.store(y, (i,), call(func, x[i]))
    return lower(kb.finish())


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    path = tmp_path_factory.mktemp("c_math") / "m.so"
    source = print_c_module([kernel(f) for f in FUNCS])
    return ctypes.CDLL(str(build_shared_library({"c_math": source}, path)))


def apply(lib, func: str, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    assert x.size <= N
    xs, ys = np.zeros(N, np.float32), np.zeros(N, np.float32)
    xs[:x.size] = x
    getattr(lib, f"v_{func}_{F32}")(xs.ctypes.data_as(ctypes.c_void_p),
                                    ys.ctypes.data_as(ctypes.c_void_p))
    return ys[:x.size]


def test_printer_maps_float32_only():
    src = print_c_module([kernel(f, n=8) for f in FUNCS] + [kernel(f, "float64", 8)
                                                             for f in ("exp", "tanh", "erf")])
    for func, name in FAST_FLOAT32.items():
        assert f"y[i] = {name}(x[i]);" in src
    assert "y[i] = hidetc_sigmoid_float32(x[i]);" in src
    assert re.search(r"hidetc_sigmoid_float32\(float x\) \{ return [^}]*hidetc_expf\(-x\)", src)
    for func in ("exp", "tanh", "erf"):
        assert f"y[i] = {func}(x[i]);" in src             # float64 keeps libm
    # the CUDA printer keeps CUDA's own functions (hidetc_cuda.h has no hidetc_expf)
    assert MATH_FUNCTIONS[F32]["tanh"] == "tanhf" and MATH_FUNCTIONS[F32]["exp"] == "expf"
    kb = KernelBuilder("k", target="cuda")
    x, y = kb.buffer("x", F32, (64,)), kb.buffer("y", F32, (64,))
    kb.store(y, (thread_idx(),), sum((call(f, x[thread_idx()]) for f in FAST_FLOAT32),
                                     call("sigmoid", x[thread_idx()])))
    cuda = print_cuda_function(lower(kb.finish(grid=(1, 1, 1), block=(64, 1, 1))))
    assert "hidetc_expf" not in cuda and all(f"{f}f(" in cuda for f in FAST_FLOAT32), cuda


def test_loops_vectorize_without_libm_calls(tmp_path):
    src = tmp_path / "m.c"
    src.write_text(print_c_module([kernel(f, n=4096) for f in FUNCS]))
    asm = tmp_path / "m.s"
    subprocess.run([find_compiler(), *host_flags(), "-S", str(src), "-o", str(asm)],
                   check=True)
    text = asm.read_text()
    for func in FUNCS:
        name = f"v_{func}_{F32}"
        body = text.split(f"\n{name}:\n", 1)[1].split(f".size\t{name},", 1)[0]
        assert not re.search(r"\bcall|jmp\s+\w*(exp|tanh|erf|log)f", body), (func, body)
        assert len(re.findall(r"\bv\w+ps\b[^\n]*%[yz]mm", body)) >= 8, (func, body)
        assert "vfmadd" in body or func == "sigmoid" and "vdivps" in body, func


def ulp_error(y: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|y - ref| in units of the float32 ulp at ref (2^-149 below the normal range);
    inf where y and ref disagree on NaN or on overflow (ref rounds to +-inf)."""
    _, e = np.frexp(np.abs(ref))
    ulp = np.ldexp(1.0, np.maximum(e - 24, -149))
    with np.errstate(invalid="ignore", over="ignore"):
        ref32 = ref.astype(np.float32)
        err = np.abs(y.astype(np.float64) - ref) / ulp
    special = np.isnan(ref) | np.isnan(y) | np.isinf(ref32) | np.isinf(y)
    same = (np.isnan(ref) & np.isnan(y)) | (ref32 == y)
    return np.where(special, np.where(same, 0.0, np.inf), err)


def sample(lo: float, hi: float, n: int, rng) -> np.ndarray:
    """Uniform in [lo, hi], log-uniform magnitudes 2^-149..2^max of both signs, and
    dense points around the edges."""
    big = max(abs(lo), abs(hi))
    mags = np.exp2(rng.uniform(-149, math.log2(big * 1.2), n // 4))
    edges = np.concatenate([e + rng.uniform(-0.05, 0.05, n // 40)
                            for e in (lo, hi, -87.33655, 88.72283, -103.2789, 0.625, 0.921875,
                                      -0.625, -0.921875, 3.925, 1.0)])
    return np.concatenate([rng.uniform(lo, hi, n // 2), mags, -mags, edges])[:n]


REFERENCE = {
    "exp": (np.exp, -110.0, 95.0),
    "tanh": (np.tanh, -12.0, 12.0),
    "erf": (np.vectorize(math.erf, otypes=[float]), -5.0, 5.0),
    "log": (np.log, 0.0, 4.0),
    # 1 / (1 + exp(-x)) (the IR's Sigmoid) is 0 once exp(-x) overflows (x < -88.72)
    "sigmoid": (lambda v: np.exp(-np.logaddexp(0.0, -v)), -88.7, 110.0),
}


@pytest.mark.parametrize("func", FUNCS)
def test_accuracy_against_float64(lib, func):
    ref_fn, lo, hi = REFERENCE[func]
    rng = np.random.default_rng(7)
    x = sample(lo, hi, N, rng).astype(np.float32)
    if func == "sigmoid":
        x = x[x >= lo]
    if func == "log":  # the whole positive range, and some negatives
        x = np.concatenate([np.abs(x[: N // 2]),
                            np.exp2(rng.uniform(-149, 128, N // 2 - 10)).astype(np.float32),
                            -np.abs(x[:10])])
    with np.errstate(all="ignore"):
        ref = ref_fn(x.astype(np.float64))
    err = ulp_error(apply(lib, func, x), ref)
    worst = int(np.argmax(err))
    assert err[worst] <= ULP_BOUND[func], (func, x[worst], err[worst])


INF, NAN = np.inf, np.nan
SPECIAL = {
    "exp": [(-INF, 0.0), (INF, INF), (NAN, NAN), (0.0, 1.0), (-0.0, 1.0), (100.0, INF),
            (-200.0, 0.0), (89.0, INF), (-104.0, 0.0), (1.0, np.float32(math.e))],
    "tanh": [(INF, 1.0), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (20.0, 1.0),
             (-9.5, -1.0), (1e-30, 1e-30), (-1e-40, -1e-40)],
    "erf": [(INF, 1.0), (-INF, -1.0), (NAN, NAN), (0.0, 0.0), (-0.0, -0.0), (5.0, 1.0),
            (-4.0, -1.0), (3.93, 1.0)],
    "log": [(0.0, -INF), (-0.0, -INF), (-1.0, NAN), (-INF, NAN), (INF, INF), (NAN, NAN),
            (1.0, 0.0), (np.float32(2.0 ** -149), np.float32(-149 * math.log(2)))],
    "sigmoid": [(INF, 1.0), (-INF, 0.0), (NAN, NAN), (0.0, 0.5), (-200.0, 0.0), (50.0, 1.0)],
}


@pytest.mark.parametrize("func", FUNCS)
def test_special_values(lib, func):
    x, want = (np.array(v, np.float32) for v in zip(*SPECIAL[func]))
    got = apply(lib, func, x)
    np.testing.assert_array_equal(got, want, err_msg=func)
    numbers = ~np.isnan(want)
    np.testing.assert_array_equal(np.signbit(got[numbers]), np.signbit(want[numbers]),
                                  err_msg=func)
