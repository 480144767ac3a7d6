"""hidetc.tir.cuda: the typed intrinsic constructors print as the CUDA printer and the
device header expect (helper names, operand order, `&buf[i]` address operands, the full
mask added to warp intrinsics) and reject bad operands when the kernel is built."""
import pytest

from hidetc.backends.codegen.cuda import print_cuda_function
from hidetc.tir import cuda
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.ir import Const, Evaluate
from hidetc.tir.pipeline import lower

F16, F32, U32 = "float16", "float32", "uint32"


def kernel_text() -> str:
    kb = KernelBuilder("intrinsics", target="cuda")
    a, x = kb.buffer("a", F16, (64, 16)), kb.buffer("x", F32, (32,))
    out = kb.buffer("out", F32, (32,))
    s = kb.alloc("s", F16, (64, 16), "shared")
    fa, fb = kb.alloc("fa", U32, (4,)), kb.alloc("fb", U32, (2,))
    acc = kb.alloc("acc", F32, (4,))
    t = cuda.thread_idx()
    kb.emit(cuda.cp_async(s[t, 0], a[t, 0], 16, t < 30))
    kb.emit(cuda.cp_async(s[t, 8], a[t, 8], 8))
    kb.emit(cuda.cp_async_commit())
    kb.emit(cuda.cp_async_wait(1))
    kb.emit(cuda.cp_async_wait_all())
    kb.emit(cuda.syncthreads())
    kb.emit(cuda.ldmatrix(fa[0], s[t % 16, t // 16 * 8], 4))
    kb.emit(cuda.ldmatrix(fb[0], s[t % 16, 0], 2, trans=True))
    kb.emit(cuda.mma_m16n8k16(acc[0], fa[0], fb[0]))
    kb.emit(cuda.mma_m16n8k16(acc[0], fa[0], fb[0], acc[0]))
    v = kb.declare("v", F32, x[t])
    kb.assign(v, v + cuda.shfl_down(v, 16) + cuda.shfl_xor(v, 1) + cuda.shfl_up(v, 2, width=8))
    kb.assign(v, v + cuda.shfl(v, 0))
    kb.store(out, (t,), v)
    kb.emit(cuda.copy(out[t], acc[0], 4))
    return print_cuda_function(lower(kb.finish(grid=(1, 1, 1), block=(32, 1, 1))))


def test_intrinsics_print_as_the_header_expects():
    text = kernel_text()
    expected = [
        "hidetc_cp_async16(&s[tx * 16], &a[tx * 16], tx < 30);",
        "hidetc_cp_async8(&s[tx * 16 + 8], &a[tx * 16 + 8], true);",
        "hidetc_cp_async_commit();", "hidetc_cp_async_wait_group(1);",
        "hidetc_cp_async_wait_all();", "__syncthreads();",
        "hidetc_ldmatrix_x4(&fa[0], &s[",
        "hidetc_ldmatrix_x2_trans(&fb[0], &s[tx % 16 * 16]);",
        "hidetc_mma_m16n8k16_f16f32(&acc[0], &fa[0], &fb[0], &acc[0]);",
        "__shfl_down_sync(0xffffffffu, v, 16)", "__shfl_xor_sync(0xffffffffu, v, 1)",
        "__shfl_up_sync(4294967295u, v, 2, 8)", "__shfl_sync(0xffffffffu, v, 0)",
        "hidetc_copy4(&out[tx], &acc[0]);",
    ]
    text = text.replace("(int32_t)threadIdx.x", "tx")
    for line in expected:
        assert line in text, f"{line!r} not in\n{text}"
    assert "const half *__restrict__ a" in text and "float *__restrict__ out" in text


def test_votes_and_address_of():
    p = Const(True, "bool")
    assert cuda.ballot(p).func == "__ballot_sync" and cuda.ballot(p).dtype == U32
    assert cuda.any_sync(p).dtype == "int32" and cuda.all_sync(p).func == "__all_sync"
    kb = KernelBuilder("k", target="cuda")
    a = kb.buffer("a", F32, (4,))
    assert cuda.address_of(a[1]).args == (a[1],)
    assert isinstance(cuda.cp_async_commit(), Evaluate)


def test_bad_operands_are_rejected():
    kb = KernelBuilder("bad", target="cuda")
    g = kb.buffer("g", F16, (64,))
    s = kb.alloc("s", F16, (64,), "shared")
    f32s = kb.alloc("f32s", F32, (64,), "shared")
    regs, small = kb.alloc("regs", U32, (4,)), kb.alloc("small", U32, (1,))
    acc = kb.alloc("acc", F32, (4,))
    with pytest.raises(ValueError, match="4, 8 or 16"):
        cuda.cp_async(s[0], g[0], 2)
    with pytest.raises(ValueError, match="scope"):
        cuda.cp_async(g[0], s[0], 16)          # global destination
    with pytest.raises(ValueError, match="a Load"):
        cuda.cp_async(s[0], g[0] + g[1], 16)
    with pytest.raises(ValueError, match="bool"):
        cuda.cp_async(s[0], g[0], 16, Const(1, "int32"))
    with pytest.raises(ValueError, match="0..7"):
        cuda.cp_async_wait(8)
    with pytest.raises(ValueError, match="1, 2 or 4"):
        cuda.ldmatrix(regs[0], s[0], 3)
    with pytest.raises(ValueError, match="16-bit"):
        cuda.ldmatrix(regs[0], f32s[0], 4)
    with pytest.raises(ValueError, match="at least 16"):
        cuda.ldmatrix(small[0], s[0], 4)
    with pytest.raises(ValueError, match="float32"):
        cuda.mma_m16n8k16(regs[0], regs[0], regs[0])
    with pytest.raises(ValueError, match="scope"):
        cuda.mma_m16n8k16(acc[0], s[0], regs[0])
    with pytest.raises(ValueError, match="width"):
        cuda.shfl_down(acc[0], 1, width=3)
