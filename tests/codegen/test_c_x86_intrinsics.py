"""The C printer's AVX2/FMA intrinsics (X86_INTRINSICS, dtype float32x8): printed as
the intrinsic with `&buf[i]` for address operands, `#include <immintrin.h>` only in
modules that use them, and the compiled kernel computes fma exactly."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from hidetc.backends.codegen.c import print_c_module
from hidetc.backends.toolchain.gcc import build_shared_library
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Call, Const
from hidetc.tir.pipeline import lower

V = "float32x8"


def axpy_kernel():
    """out[i*8:(i+1)*8] = fma(a[0], x[i*8:], y[i*8:]) for 4 vectors, through a local."""
    kb = KernelBuilder("vaxpy", "cpu")
    a = kb.buffer("a", "float32", (1,))
    x = kb.buffer("x", "float32", (4, 8))
    y = kb.buffer("y", "float32", (4, 8))
    out = kb.buffer("out", "float32", (4, 8))
    tmp = kb.alloc("tmp", "float32", (8,))
    with kb.for_range(4, name="i") as i:
        av = kb.declare("av", V, Call("_mm256_broadcast_ss", (a[0],), V))
        acc = kb.declare("acc", V, Call("_mm256_setzero_ps", (), V))
        xv = Call("_mm256_loadu_ps", (x[i, 0],), V)
        yv = Call("_mm256_loadu_ps", (y[i, 0],), V)
        kb.assign(acc, Call("_mm256_fmadd_ps", (av, xv, yv), V))
        zero = Call("_mm256_set1_ps", (Const(0.0, "float32"),), V)
        kb.assign(acc, Call("_mm256_add_ps", (acc, zero), V))
        kb.evaluate(Call("_mm256_storeu_ps", (tmp[0], acc), "void"))
        with kb.for_range(8, name="j") as j:
            kb.store(out, (i, j), tmp[j])
    return kb.finish()


def test_prints_intrinsics_and_includes_the_header_only_when_used(tmp_path):
    src = print_c_module([lower(axpy_kernel())])
    assert "#include <immintrin.h>" in src
    assert "__m256 av = _mm256_broadcast_ss(&a[0]);" in src
    assert "_mm256_storeu_ps(&tmp[0], acc)" in src
    kb = KernelBuilder("plain", "cpu")
    o = kb.buffer("o", "float32", (1,))
    kb.store(o, (0,), Const(1.0, "float32"))
    assert "immintrin" not in print_c_module([lower(kb.finish())])


def test_address_operand_must_be_a_load():
    kb = KernelBuilder("bad", "cpu")
    kb.buffer("o", "float32", (8,))
    kb.declare("v", V, Call("_mm256_broadcast_ss", (Const(1.0, "float32"),), V))
    with pytest.raises(ValueError, match="passed by address"):
        print_c_module([lower(kb.finish())])


def test_compiled_intrinsics_compute_fma(tmp_path):
    lib = ctypes.CDLL(str(build_shared_library(
        {"vaxpy": print_c_module([lower(axpy_kernel())])}, tmp_path / "v.so")))
    rng = np.random.default_rng(0)
    a = np.array([1.0 + 2.0 ** -20], np.float32)
    x, y = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2))
    out = np.zeros((4, 8), np.float32)
    lib.vaxpy(*(arr.ctypes.data_as(ctypes.c_void_p) for arr in (a, x, y, out)))
    want = (a.astype(np.float64)[0] * x.astype(np.float64) + y).astype(np.float32)
    np.testing.assert_array_equal(out, want)  # fused: one rounding of the exact a*x+y
