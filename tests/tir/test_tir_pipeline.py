"""The lowering pipeline: order, verification between passes, dumps, semantics."""
import numpy as np
import pytest

from hidetc.tir.builder import KernelBuilder
from hidetc.tir.evaluate import run_function
from hidetc.tir.ir import Function, MapFor, Seq, Store, Var
from hidetc.tir.mapping import repeat, spatial
from hidetc.tir.passes.verify import TirVerifyError
from hidetc.tir.pipeline import LOWERING_PASSES, lower
from hidetc.tir.printer import format_function


def add_kernel(n=100):
    kb = KernelBuilder("vadd")
    a = kb.buffer("a", "float32", (n,))
    b = kb.buffer("b", "float32", (n,))
    out = kb.buffer("out", "float32", (n,))
    m = repeat(4) * spatial(8)
    with kb.for_range((n + 31) // 32, kind="parallel", name="blk") as blk:
        with kb.for_range(8, name="w") as w:
            with kb.for_mapping(m, w) as (i,):
                idx = blk * 32 + i
                with kb.if_then(idx < n):
                    kb.store(out, (idx,), a[idx] + b[idx])
    return kb.finish()


def test_pass_order():
    assert [name for name, _ in LOWERING_PASSES] == [
        "lower_mappings", "simplify", "flatten_buffers", "simplify_flat"]


def test_lower_result_is_lowered_flat_and_correct():
    fn = add_kernel()
    low = lower(fn)
    text = format_function(low)
    assert ".on(" not in text and "flattened=True" in text
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(100).astype(np.float32) for _ in range(2))
    out = np.zeros(100, np.float32)
    run_function(low, [a, b, out])
    np.testing.assert_array_equal(out, a + b)
    assert lower(low) is low


def test_dump_dir(tmp_path):
    lower(add_kernel(), dump_dir=tmp_path)
    files = sorted(p.name for p in (tmp_path / "vadd").iterdir())
    assert files == ["00_input.txt", "01_lower_mappings.txt", "02_simplify.txt",
                     "03_flatten_buffers.txt", "04_simplify_flat.txt"]
    assert ".on(w)" in (tmp_path / "vadd" / "00_input.txt").read_text()


def test_verification_names_the_failing_pass():
    def break_scope(fn):
        stray = Store(fn.params[2], (Var("nowhere"),), fn.params[0][0])
        return Function(fn.name, fn.params, Seq((fn.body, stray)), fn.attrs)

    passes = LOWERING_PASSES[:1] + (("break_scope", break_scope),)
    with pytest.raises(TirVerifyError, match="after pass break_scope.*nowhere"):
        lower(add_kernel(), passes=passes)
    lower(add_kernel(), passes=passes, verify=False)


def test_input_is_verified():
    fn = add_kernel()
    bad = Function(fn.name, fn.params, MapFor((), spatial(2), Var("q"), Seq(())), fn.attrs)
    with pytest.raises(TirVerifyError, match="input of the lowering pipeline"):
        lower(bad)
