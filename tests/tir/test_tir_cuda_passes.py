"""Before/after tests of what the CUDA kernels need from the TIR passes: ranges of the
CUDA built-ins in `simplify`, impure calls that no rule drops or duplicates, and
unrolled `repeat` loops from `lower_mappings` (cuda only; the cpu target is unchanged)."""
import pytest

from hidetc.backends.codegen.cuda import print_cuda_function
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import (
    Call,
    Const,
    Evaluate,
    Function,
    If,
    Seq,
    Var,
    block_dim,
    block_idx,
    logical_and,
    thread_idx,
)
from hidetc.tir.mapping import repeat, spatial
from hidetc.tir.passes.lower_mappings import UNROLL_MAX_EXTENT, lower_mappings
from hidetc.tir.passes.simplify import effects, simplify, simplify_expr
from hidetc.tir.passes.verify import verify_function
from hidetc.tir.pipeline import lower
from hidetc.tir.printer import format_expr, format_function

I32, F32 = "int32", "float32"
LAUNCH = dict(grid=(10, 1, 1), block=(128, 1, 1))


def mapped(target: str, mapping, worker, **attrs):
    kb = KernelBuilder("k", target=target)
    out = kb.buffer("out", F32, mapping.task_shape)
    with kb.for_mapping(mapping, worker) as idx:
        kb.store(out, idx, Const(1.0, F32))
    return kb.finish(**attrs)


def body_lines(fn: Function) -> list[str]:
    return format_function(fn).splitlines()[1:]


# simplify: ranges of the CUDA built-ins ----------------------------------------------
def test_thread_guard_vanishes_with_the_block_attr():
    fn = lower_mappings(mapped("cuda", repeat(4, 1) * spatial(16, 8), thread_idx(), **LAUNCH))
    assert "if threadIdx.x() < 128:" in format_function(fn)          # before
    after = simplify(fn)
    assert "if" not in format_function(after)                         # after
    verify_function(after, lowered=True)
    assert simplify(after) is after


def test_guard_stays_without_a_proof():
    small = lower_mappings(mapped("cuda", spatial(16, 8), thread_idx(),
                                  grid=(1, 1, 1), block=(256, 1, 1)))
    assert "if threadIdx.x() < 128:" in format_function(simplify(small))
    cpu = lower_mappings(mapped("cpu", spatial(16, 8), thread_idx()))
    assert "if threadIdx.x() < 128:" in format_function(simplify(cpu))


def test_index_math_folds_with_builtin_ranges():
    kb = KernelBuilder("k", target="cuda")
    out = kb.buffer("out", I32, (64,))
    tid, bid = thread_idx(), block_idx()
    kb.store(out, (tid % 32,), tid // 4 % 8 + (bid < 10) * 0 + (tid % 32) // 32)
    with kb.if_then(logical_and(bid < 10, block_dim() > 31)):
        kb.store(out, (0,), block_idx("y") + 1)
    fn = kb.finish(grid=(10, 1, 1), block=(32, 1, 1))
    assert body_lines(simplify(fn)) == [
        "    out[threadIdx.x()] = threadIdx.x() // 4",
        "    out[0] = blockIdx.y() + 1",
    ]


# simplify: impure calls ------------------------------------------------------------------
SHFL = Call("__shfl_down_sync", (Var("v"), Const(16, I32)), I32)
ATOMIC = Call("atomicAdd", (Var("p"), Const(1, I32)), I32)


@pytest.mark.parametrize("expr,expected", [
    (SHFL * 0, "__shfl_down_sync(v, 16) * 0"),
    (SHFL % 1, "__shfl_down_sync(v, 16) % 1"),
    ((SHFL * 4) % 4, "__shfl_down_sync(v, 16) * 4 % 4"),
    (logical_and(SHFL < 3, Const(False, "bool")), "__shfl_down_sync(v, 16) < 3 && False"),
    (ATOMIC * 0 + 5, "atomicAdd(p, 1) * 0 + 5"),
    (SHFL + 0, "__shfl_down_sync(v, 16)"),          # kept once: fine
    (SHFL * 1 + (Var("x") * 0), "__shfl_down_sync(v, 16)"),
    (Call("__popc", (Var("x"),), I32) * 0, "0"),  # a registered pure intrinsic
])
def test_rules_never_drop_impure_calls(expr, expected):
    out = simplify_expr(expr)
    assert format_expr(out) == expected
    assert effects(out) == effects(expr)


def test_statements_keep_impure_conditions_and_extents():
    x = Var("x")
    fn = Function("f", (x,), Seq((If(SHFL < 3, Seq(())), If(x < 3, Seq(())))),
                  (("target", "cuda"),))
    out = simplify(fn)
    assert out.body == Evaluate(SHFL < 3)


def test_lower_mappings_rejects_an_impure_worker():
    with pytest.raises(ValueError, match="must be pure"):
        lower_mappings(mapped("cuda", spatial(32), SHFL, **LAUNCH))


# lower_mappings: unrolled repeat loops on cuda ---------------------------------------------
def test_small_repeats_unroll_on_cuda_only():
    m = repeat(4, UNROLL_MAX_EXTENT + 1) * spatial(16, 8)
    cuda = lower_mappings(mapped("cuda", m, thread_idx(), **LAUNCH))
    text = format_function(cuda)
    assert "for t0_ro0 in unroll(4):" in text
    assert f"for t0_ro1 in range({UNROLL_MAX_EXTENT + 1}):" in text
    cpu = format_function(lower_mappings(mapped("cpu", m, Const(0, I32))))
    assert "for t0_ro0 in range(4):" in cpu and "unroll" not in cpu


def test_unrolled_fragment_gets_constant_indices():
    """A register tile indexed by unrolled repeat variables: nvcc sees constants."""
    kb = KernelBuilder("k", target="cuda")
    out = kb.buffer("out", F32, (128, 4))
    acc = kb.alloc("acc", F32, (4,))
    with kb.for_mapping(repeat(4), 0, names=["u"]) as (u,):
        kb.store(acc, (u,), Const(2.0, F32))
    with kb.for_mapping(spatial(128) * repeat(4), thread_idx(), names=["i"]) as (i,):
        kb.store(out, (i // 4, i % 4), acc[i % 4])
    src = print_cuda_function(lower(kb.finish(**LAUNCH)))
    assert src.count("#pragma unroll") == 2
    assert "acc[u_r0] = 2.0f;" in src
    assert "if" not in src  # the thread guard is proven
