"""Facts about the intrinsic calls kernels make, shared by every pass that reads them
(the start of one registry; see the README's architecture): which of an intrinsic's
operands are passed by address, so grafting and the C printer treat a `Load` there as
a pointer, not a value.

`X86_INTRINSICS`: the AVX2/FMA and AVX-512F intrinsics the CPU micro-kernels call
(`schedules/cpu/avx2.py`), and gcc's software prefetch, each with the positions of its
operands passed by address. The C printer (`codegen.c`) prints those as `&x`; grafting
(`fusion.graft`) leaves them as loads of the buffer they point into.
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
