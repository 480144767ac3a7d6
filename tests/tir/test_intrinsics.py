"""The intrinsic registry (hidetc/tir/intrinsics.py) against what reads and defines the
intrinsics: every CUDA record is defined for nvcc and for the emulator, every typed
constructor of tir/cuda.py and x86 helper of the CPU micro-kernels names a registered
intrinsic, the printers refuse an unregistered one, and purity follows the records."""
from __future__ import annotations

import re

import pytest

from hidetc.backends.codegen.c import print_c_module
from hidetc.backends.codegen.c_bf16 import BF16_SOURCE
from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module
from hidetc.backends.runtime.emulator.emulator import EMULATOR_DIR
from hidetc.compute.narrow_types import C_FUNCTIONS as NARROW_FUNCTIONS
from hidetc.tir import cuda as tc
from hidetc.tir import intrinsics
from hidetc.tir.builder import KernelBuilder
from hidetc.tir.functor import Rewriter
from hidetc.tir.intrinsics import REGISTRY
from hidetc.tir.ir import Call, Const, Evaluate, Var
from hidetc.tir.pipeline import lower

HEADER = (CUDA_INCLUDE_DIR / "hidetc_cuda.h").read_text()
EMU_HEADER = (EMULATOR_DIR / "hidetc_emu.h").read_text()


def _sections(text: str) -> tuple[str, str]:
    """(the nvcc section, the emulator section) of hidetc_cuda.h's device helpers."""
    start = text.index("#ifndef HIDETC_EMULATE", text.index("#endif"))
    middle = text.index("#else", start)
    end = text.index("#endif", middle)
    return text[start:middle], text[middle:end]


def _expand(text: str) -> str:
    """`text` with its function-like macros expanded once (the header defines the copy,
    cp.async and ldmatrix families through `NAME##N` macros)."""
    text = text.replace("\\\n", " ")
    for name, params, body in re.findall(r"^#define (\w+)\(([^)]*)\)(.*)$", text, re.M):
        names = [p.strip() for p in params.split(",")]
        for call in re.findall(rf"^{name}\(([^)]*)\)", text, re.M):
            out = body
            for param, arg in zip(names, [a.strip() for a in call.split(",")]):
                out = re.sub(rf"\b{param}\b", arg, out)
            text += "\n" + out.replace("##", "").replace(" #", " ")
    return text


def _defines(text: str, name: str) -> bool:
    """A function definition of `name` (a return type, the name, its parameters), or a
    function-like macro of that name."""
    if re.search(rf"^#define {re.escape(name)}\(", text, re.M):
        return True
    return bool(re.search(rf"\b(void|int|unsigned|T|float|bool)\s+\**{re.escape(name)}\s*\(",
                          _expand(text)))


CUDA_HELPERS = sorted(n for n, r in REGISTRY.items() if r.defined_in == "hidetc_cuda.h")
CUDA_BUILTINS = sorted(n for n, r in REGISTRY.items()
                       if r.defined_in == "cuda" and n != "address_of")


@pytest.mark.parametrize("name", CUDA_HELPERS)
def test_every_device_helper_is_defined_for_nvcc_and_the_emulator(name):
    nvcc, emulated = _sections(HEADER)
    assert _defines(nvcc, name), f"{name}: not in hidetc_cuda.h's nvcc section"
    assert _defines(emulated, name), f"{name}: not in hidetc_cuda.h's emulator section"


@pytest.mark.parametrize("name", CUDA_BUILTINS)
def test_every_cuda_builtin_is_implemented_by_the_emulator(name):
    assert _defines(EMU_HEADER, name), f"{name}: the emulator (hidetc_emu.h) lacks it"


@pytest.mark.parametrize("name", [r.name for r in REGISTRY.values() if r.defined_in == "c_bf16"])
def test_every_bf16_block_helper_is_defined_in_its_source(name):
    assert _defines(BF16_SOURCE, name), f"{name}: not in c_bf16.BF16_SOURCE"


def test_records_are_consistent():
    for record in REGISTRY.values():
        assert record.printer in ("c", "cuda")
        assert list(record.address_args) == sorted(set(record.address_args))
        assert all(0 <= i < 9 for i in record.address_args)
        if record.copy_bytes or record.asynchronous:
            assert record.copy_bytes in (4, 8, 16) and record.address_args[:2] == (0, 1)
            assert not record.pure
        if record.warp_operands is not None:
            assert record.printer == "cuda" and not record.pure
        if record.value_form is not None:
            twin, width = record.value_form
            assert REGISTRY[twin].printer == record.printer and width >= 1


class _Calls(Rewriter):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_Call(self, e: Call):
        self.names.add(e.func)
        return super().visit_Call(e)


def _calls(stmt) -> set[str]:
    (found := _Calls()).stmt(stmt)
    return found.names


def test_the_typed_cuda_constructors_name_registered_intrinsics():
    kb = KernelBuilder("k", target="cuda")
    smem = kb.alloc("s", "float16", (64,), scope="shared")
    gmem = kb.buffer("g", "float16", (64,))
    regs = kb.alloc("r", "uint32", (4,), scope="local")
    acc = kb.alloc("c", "float32", (4,), scope="local")
    floats = kb.buffer("f", "float32", (64,))
    made = [tc.load_f4(acc[0], floats[4]), tc.copy(smem[0], gmem[0], 16),
            tc.cp_async(smem[0], gmem[0], 16, True),
            tc.cp_async_commit(), tc.cp_async_wait(1), tc.cp_async_wait_all(),
            tc.ldmatrix(regs[0], smem[0], 4), tc.ldmatrix(regs[0], smem[0], 2, trans=True),
            tc.mma_m16n8k16(acc[0], regs[0], regs[2]), tc.syncthreads(),
            Evaluate(tc.shfl_xor(Var("v", "int32"), 1)), Evaluate(tc.ballot(Var("p", "bool"))),
            Evaluate(tc.address_of(gmem[1])), tc.threadfence(),
            Evaluate(tc.atomic_add(kb.buffer("n", "int32", (4,))[0], 1)),
            Evaluate(tc.load_cg(floats[3]))]
    names = set().union(*(_calls(s) for s in made))
    assert names and all(intrinsics.lookup(n, "cuda") for n in names), names


def test_unregistered_intrinsics_are_impure_and_math_is_pure():
    assert intrinsics.impure("__shfl_sync") and intrinsics.impure("atomicAdd")
    assert intrinsics.impure("_mm256_storeu_ps") and intrinsics.impure("hidetc_cp_async16")
    assert intrinsics.impure("hidetc_not_registered") and intrinsics.impure("__nope")
    assert not intrinsics.impure("exp") and not intrinsics.impure("_mm256_fmadd_ps")
    assert not intrinsics.impure("__popc")
    assert not any(intrinsics.impure(name) for name in NARROW_FUNCTIONS)


def _kernel(target: str, call: Call):
    kb = KernelBuilder("k", target=target)
    out = kb.buffer("out", "float32", (4,))
    kb.store(out, (0,), call)
    launch = {"grid": (1, 1, 1), "block": (32, 1, 1)} if target == "cuda" else {}
    return lower(kb.finish(**launch))


@pytest.mark.parametrize("target,printer", [("cpu", print_c_module),
                                            ("cuda", print_cuda_module)])
def test_the_printers_refuse_an_unregistered_intrinsic(target, printer):
    fn = _kernel(target, Call("hidetc_frobnicate", (Const(1.0, "float32"),), "float32"))
    with pytest.raises(ValueError, match="hidetc_frobnicate.*not registered"):
        printer([fn])


def test_the_c_printer_refuses_the_cuda_printers_intrinsics():
    fn = _kernel("cpu", Call("__shfl_sync", (Const(1.0, "float32"), Const(0, "int32")),
                             "float32"))
    with pytest.raises(ValueError, match="not registered for the c printer"):
        print_c_module([fn])
