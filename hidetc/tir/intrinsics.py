"""Facts about the intrinsic calls kernels make (`Call(name, ...)` with a name that is
not an IR operator), in one place for every pass that reads them: the simplifier
(purity), grafting (address operands, copies to expand, value forms), and the C and
CUDA printers (address operands, warp collectives). The printers' spellings and the
emulator's implementations (`runtime/emulator/hidetc_emu.h`) stay with them; what an
intrinsic *is* lives here.

- `IMPURE_PREFIXES`: calls with effects or a result that depends on other threads
  (warp collectives, barriers, fences, atomics, copies, cp.async, ldmatrix, mma): the
  simplifier never duplicates, drops or merges them (`impure`).
- `X86_INTRINSICS`: the AVX2/FMA and AVX-512F intrinsics the CPU micro-kernels call
  (`schedules/cpu/avx2.py`), and gcc's software prefetch, with the positions of the
  operands passed by address (the C printer prints those as `&x`; grafting leaves them
  as loads of the buffer they point into). `VALUE_FORMS`: a vector load's twin built
  from values, for a grafted prologue that computes instead of loads.
- `CUDA_ADDRESS_ARGS`: the CUDA device helpers' address operands (operand 0: the
  destination); `WARP_INTRINSICS`: the warp collectives' operand counts after the mask.
- `COPIES` / `ASYNC_COPIES`: the vector copies (bytes each), which grafting expands into
  element loads when it rewrites their source.
"""
from __future__ import annotations

# AVX2/FMA and AVX-512F intrinsic -> positions of its operands passed by address (a Load)
X86_INTRINSICS: dict[str, tuple[int, ...]] = {
    "_mm256_loadu_ps": (0,), "_mm256_storeu_ps": (0,), "_mm256_broadcast_ss": (0,),
    "_mm256_fmadd_ps": (), "_mm256_add_ps": (), "_mm256_max_ps": (),
    "_mm256_sub_ps": (), "_mm256_mul_ps": (), "_mm512_sub_ps": (), "_mm512_mul_ps": (),
    "_mm256_setzero_ps": (), "_mm256_set1_ps": (), "_mm256_setr_ps": (),
    "_mm512_loadu_ps": (0,), "_mm512_storeu_ps": (0,), "_mm512_fmadd_ps": (),
    "_mm512_add_ps": (), "_mm512_setzero_ps": (), "_mm512_set1_ps": (), "_mm512_setr_ps": (),
    "__builtin_prefetch": (0,),   # (&x, rw, locality): gcc's software prefetch
}


IMPURE_PREFIXES = ("__shfl", "__ballot", "__any", "__all", "__activemask", "__syncthreads",
                   "__syncwarp", "__threadfence", "__trap", "atomic", "hidetc_copy",
                   "hidetc_cp_async", "hidetc_ld_", "hidetc_ldmatrix", "hidetc_mma")


def impure(name: str) -> bool:
    return name.startswith(IMPURE_PREFIXES)


COPIES = {"hidetc_copy4": 4, "hidetc_copy8": 8, "hidetc_copy16": 16, "hidetc_ld_f4": 16}
# vector loads from memory -> the same vector built from values (memory order)
VALUE_FORMS = {"_mm256_broadcast_ss": ("_mm256_set1_ps", 1),
               "_mm256_loadu_ps": ("_mm256_setr_ps", 8),
               "_mm512_loadu_ps": ("_mm512_setr_ps", 16)}
ASYNC_COPIES = {"hidetc_cp_async4": 4, "hidetc_cp_async8": 8, "hidetc_cp_async16": 16}

# name -> (operands after the mask, optional trailing operands)
WARP_INTRINSICS: dict[str, tuple[int, int]] = {
    "__shfl_sync": (2, 1), "__shfl_up_sync": (2, 1), "__shfl_down_sync": (2, 1),
    "__shfl_xor_sync": (2, 1), "__ballot_sync": (1, 0), "__any_sync": (1, 0),
    "__all_sync": (1, 0), "__syncwarp": (0, 0),
}
_LDMATRIX = {f"hidetc_ldmatrix_x{n}{t}": (0, 1) for n in (1, 2, 4) for t in ("", "_trans")}
# name -> positions of the operands passed by address (operand 0: the destination)
CUDA_ADDRESS_ARGS: dict[str, tuple[int, ...]] = {
    **{f"atomic{op}": (0,) for op in ("Add", "Sub", "Max", "Min", "Exch", "CAS")},
    **{f"hidetc_copy{n}": (0, 1) for n in (4, 8, 16)},
    **{f"hidetc_cp_async{n}": (0, 1) for n in (4, 8, 16)},
    **_LDMATRIX,
    "hidetc_ld_f4": (0, 1),
    "hidetc_mma_m16n8k16_f16f32": (0, 1, 2, 3),
    "address_of": (0,),
}
