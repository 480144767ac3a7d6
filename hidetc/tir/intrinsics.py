"""The intrinsic registry: one record per intrinsic call kernels make (`Call(name, ...)`
with a name that is not an IR operator or a math function), read by every pass that
must know what the call is: the simplifier (purity), grafting (address operands, the
copies it expands into element loads, value forms), the C and CUDA printers (address
operands, the warp collectives' mask, which names they accept) and the tests that hold
the emulator to it (tests/tir/test_intrinsics.py: every CUDA record is defined where it
says, in `codegen/cuda_include/hidetc_cuda.h` for nvcc and the emulator alike, or among
the CUDA built-ins the emulator implements in `runtime/emulator/hidetc_emu.h`).

Decides:
- `Intrinsic.address_args`: operand positions passed by address. The IR gives them as
  buffer elements (`Load`s); the printers print `&buf[i]`; grafting refuses to fuse a
  buffer whose address is taken (it cannot compute an address), except for the copies.
- `pure`: False for calls with effects or a result that depends on other threads (vector
  stores, prefetches, warp collectives, barriers, fences, atomics, copies, cp.async,
  ldmatrix, mma): the
  simplifier never duplicates, drops or merges them. An unregistered name that looks
  like an intrinsic (`__`, `_mm`, `atomic`, `hidetc_` prefixes, but not the narrow
  types' `hidetc_decode_`/`hidetc_encode_` conversions) counts as impure too, and the
  printers refuse it, so a new intrinsic is registered before it is used.
- `copy_bytes`: a vector copy `(dst, src[, pred])` of that many bytes; grafting expands
  it into element loads and stores when it rewrites either side. `asynchronous`: a
  cp.async (completes at a wait; `pred` false zero-fills dst).
- `value_form`: a vector load's twin built from `width` values (memory order), for a
  grafted prologue that computes instead of loads.
- `warp_operands`: (operands after the mask, optional trailing operands); the IR omits
  the mask and the CUDA printer passes the full one.
- `printer`: which printer spells it ("c" or "cuda"), `defined_in` where its spelling
  comes from ("immintrin.h", "gcc", "hidetc_cuda.h", "cuda": a CUDA built-in, "c_bf16":
  the bf16 GEMM blocks of `hidetc.backends.codegen.c_bf16`, "c_int8": the int8 ones of
  `c_int8`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Intrinsic:
    name: str
    printer: str                           # "c" | "cuda"
    defined_in: str                        # "immintrin.h" | "gcc" | "hidetc_cuda.h" | "cuda"
    address_args: tuple[int, ...] = ()
    pure: bool = True
    copy_bytes: int = 0
    asynchronous: bool = False
    value_form: Optional[tuple[str, int]] = None
    warp_operands: Optional[tuple[int, int]] = None


def _x86(name: str, address_args: tuple[int, ...] = (), pure: bool = True,
         value_form: Optional[tuple[str, int]] = None) -> Intrinsic:
    return Intrinsic(name, "c", "immintrin.h", address_args, pure, value_form=value_form)


def _cuda(name: str, address_args: tuple[int, ...] = (), pure: bool = False,
          defined_in: str = "hidetc_cuda.h", **facts) -> Intrinsic:
    return Intrinsic(name, "cuda", defined_in, address_args, pure, **facts)


# the bf16 GEMM blocks (C helpers of `hidetc.backends.codegen.c_bf16`, carried by the
# modules that call them): (a, lda, b, pst, c, ldc, rows, panels, kp), a, b, c by address
BF16_AMX, BF16_DP = "hidetc_bf16_gemm_amx", "hidetc_bf16_gemm_dp"
BF16_CALLS = (BF16_AMX, BF16_DP)
# the int8 GEMM blocks (C helpers of `hidetc.backends.codegen.c_int8`, likewise):
# (a, kp, b, pst, c, ldc, rows, panels), a, b, c by address
INT8_AMX, INT8_VNNI, INT8_AVXVNNI, INT8_AVX2 = (
    "hidetc_i8_gemm_amx", "hidetc_i8_gemm_vnni", "hidetc_i8_gemm_avxvnni", "hidetc_i8_gemm_avx2")
INT8_CALLS = (INT8_AMX, INT8_VNNI, INT8_AVXVNNI, INT8_AVX2)

_RECORDS: list[Intrinsic] = [
    # AVX2/FMA and AVX-512F (schedules/cpu/avx2.py), and gcc's software prefetch
    *(_x86(f"_mm{bits}_{op}_ps") for bits in (256, 512)
      for op in ("fmadd", "add", "sub", "mul", "max", "min", "setzero", "set1", "setr")),
    # (the lane min / max of `schedules/cpu/reduce`: NaN found by an unordered compare)
    _x86("_mm256_cmp_ps"), _x86("_mm256_or_ps"), _x86("_mm256_movemask_ps"),
    _x86("_mm256_loadu_ps", (0,), value_form=("_mm256_setr_ps", 8)),
    _x86("_mm512_loadu_ps", (0,), value_form=("_mm512_setr_ps", 16)),
    _x86("_mm256_storeu_ps", (0,), pure=False), _x86("_mm512_storeu_ps", (0,), pure=False),
    _x86("_mm256_broadcast_ss", (0,), value_form=("_mm256_set1_ps", 1)),
    Intrinsic("__builtin_prefetch", "c", "gcc", (0,), pure=False),   # (&x, rw, locality)
    # the bf16 GEMM blocks (C helpers carried by the modules that call them)
    *(Intrinsic(name, "c", "c_bf16", (0, 2, 4), pure=False)
      for name in BF16_CALLS),
    *(Intrinsic(name, "c", "c_int8", (0, 2, 4), pure=False) for name in INT8_CALLS),
    # CUDA built-ins (the emulator's hidetc_emu.h implements each)
    *(_cuda(name, defined_in="cuda", warp_operands=(2, 1))
      for name in ("__shfl_sync", "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync")),
    *(_cuda(name, defined_in="cuda", warp_operands=(1, 0))
      for name in ("__ballot_sync", "__any_sync", "__all_sync")),
    _cuda("__syncwarp", defined_in="cuda", warp_operands=(0, 0)),
    *(_cuda(name, defined_in="cuda")
      for name in ("__syncthreads", "__threadfence", "__threadfence_block", "__activemask",
                   "__trap")),
    *(_cuda(name, defined_in="cuda", pure=True) for name in ("__popc", "__clz", "__ffs")),
    *(_cuda(f"atomic{op}", (0,), defined_in="cuda")
      for op in ("Add", "Sub", "Max", "Min", "Exch", "CAS")),
    # a load through L2 only: impure, since what it reads is other blocks' writes
    _cuda("__ldcg", (0,), defined_in="cuda"),
    # hidetc's device helpers (hidetc_cuda.h; typed constructors in tir/cuda.py)
    *(_cuda(f"hidetc_copy{n}", (0, 1), copy_bytes=n) for n in (4, 8, 16)),
    *(_cuda(f"hidetc_cp_async{n}", (0, 1), copy_bytes=n, asynchronous=True)
      for n in (4, 8, 16)),
    _cuda("hidetc_cp_async_commit"), _cuda("hidetc_cp_async_wait_all"),
    _cuda("hidetc_cp_async_wait_group"),
    *(_cuda(f"hidetc_ldmatrix_x{n}{t}", (0, 1)) for n in (1, 2, 4) for t in ("", "_trans")),
    _cuda("hidetc_ld_f4", (0, 1), copy_bytes=16),
    _cuda("hidetc_mma_m16n8k16_f16f32", (0, 1, 2, 3)),
    _cuda("hidetc_mma_m16n8k16_bf16f32", (0, 1, 2, 3)),
    # mma.m16n8k32 on 8-bit integers (A, B each u8 or s8), and the pure register helpers
    # the int8 tensor-core template reads its fragments with (prmt, dp4a)
    *(_cuda(f"hidetc_mma_m16n8k32_{a}{b}s32", (0, 1, 2, 3)) for a in ("u8", "s8")
      for b in ("u8", "s8")),
    _cuda("hidetc_byte_perm", pure=True),
    _cuda("hidetc_bytesum_u8", pure=True), _cuda("hidetc_bytesum_s8", pure=True),
    # `&x` of a buffer element (the printer prints the address itself, no call)
    Intrinsic("address_of", "cuda", "cuda", (0,), pure=True),
]
REGISTRY: dict[str, Intrinsic] = {r.name: r for r in _RECORDS}
assert len(REGISTRY) == len(_RECORDS), "an intrinsic registered twice"

# names that can only be intrinsics: unregistered, they are impure and refused
_INTRINSIC_PREFIXES = ("__", "_mm", "atomic", "hidetc_")
# ... except the narrow types' byte conversions (`compute.narrow_types.C_FUNCTIONS`: pure
# functions of their operands, which the C printer prints as they are)
_PURE_HELPER_PREFIXES = ("hidetc_decode_", "hidetc_encode_")


def lookup(name: str, printer: Optional[str] = None) -> Optional[Intrinsic]:
    """The record of `name` (for `printer`, when given), or None: an operator or a math
    function."""
    record = REGISTRY.get(name)
    if record is None or (printer is not None and record.printer != printer):
        return None
    return record


def looks_intrinsic(name: str) -> bool:
    return name.startswith(_INTRINSIC_PREFIXES) and not name.startswith(_PURE_HELPER_PREFIXES)


def impure(name: str) -> bool:
    """Whether the simplifier must keep every call of `name` as written."""
    record = REGISTRY.get(name)
    return not record.pure if record is not None else looks_intrinsic(name)


def address_args(name: str) -> tuple[int, ...]:
    record = REGISTRY.get(name)
    return record.address_args if record is not None else ()


def require(name: str, printer: str) -> Intrinsic:
    """The record a printer spells `name` from; a ValueError names an unregistered (or
    other printer's) intrinsic."""
    record = lookup(name, printer)
    if record is None:
        raise ValueError(f"intrinsic {name!r} is not registered for the {printer} printer "
                         f"(hidetc/tir/intrinsics.py)")
    return record
