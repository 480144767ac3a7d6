"""The x86 vector ISA the CPU kernels are written for: AVX2/FMA (8 f32 lanes, 16 ymm
registers) or AVX-512F (16 lanes, 32 zmm registers).

`host_best()` is what `target.detect_cpu` puts in a compile's CpuTarget unless the
config says otherwise (`--cpu-isa`, or `HIDETC_CPU_ISA` read at the API boundary):
AVX-512 when this CPU has avx512f, read from /proc/cpuinfo, else AVX2. `current()` is
the ISA of the code this process builds to run itself (test kernels, the emulator):
`HIDETC_CPU_ISA` (`avx2`, `avx512`, or `auto`: `host_best()`). From the target's ISA:
the f32 micro-kernels (`hidetc.schedules.cpu.avx2`: the GEMM's and the direct
convolutions') print its intrinsics and vector type, the micro-tile shapes of the GEMM
and direct-conv spaces (`micro_shapes`: MR x NR tiles that fill its register file),
gcc's flags (`gcc.flags_for`), the tuning records' key (`keys.cpu_arch`), and the
artifact's `manifest["cpu_isa"]`, so a host without it refuses to load the artifact
instead of dying on an illegal instruction (`runs_here`). The reduction kernels stay
AVX2 (memory-bound; AVX-512 hosts run AVX2).

Why AVX-512 where the host has it: ONNX Runtime's MLAS uses it wherever the CPU has it,
and AVX2 kernels on such a CPU ran far behind it (twice the FLOPs per FMA instruction
and twice the registers; bench/results/2026-12-01-avx512-cpu.md).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from hidetc.errors import ConfigError

ENV = "HIDETC_CPU_ISA"
CHOICES = ("auto", "avx2", "avx512")          # HIDETC_CPU_ISA: the build's own kernels


@dataclass(frozen=True)
class Isa:
    name: str
    lanes: int                       # f32 per vector register
    gcc_flags: tuple[str, ...]
    host_flag: str                   # the /proc/cpuinfo flag a host needs
    micro_shapes: tuple[tuple[int, int], ...]   # GEMM / direct-conv MR x NR tiles


# MR x NR tiles: MR * NR/lanes accumulators + NR/lanes B vectors + 1 broadcast fit the
# register file. AVX2: see microkernel.MICRO_SHAPES' notes.
# AVX-512: 16 to 28 accumulators (two FMA units x 4 cycles latency want >= 8 chains).
AVX2 = Isa("avx2", 8, ("-mavx2", "-mfma"), "avx2",
           ((4, 16), (5, 16), (4, 24), (3, 32), (8, 8), (6, 16)))
AVX512 = Isa("avx512", 16, ("-mavx2", "-mfma", "-mavx512f"), "avx512f",
             ((8, 32), (12, 32), (14, 32), (6, 48), (8, 48), (4, 64)))
ISAS = {isa.name: isa for isa in (AVX2, AVX512)}
# Machine features recorded beside the ISA (`CpuTarget.features`): what a kernel family
# beyond the f32 ones needs. AVX512_BF16 (Cooper Lake, Sapphire Rapids and on; Zen 4):
# vdpbf16ps, pairs of bf16 multiplied and summed into f32 -- what `--precision bf16`
# needs; AMX-BF16 (Sapphire Rapids and on): 16x16 f32 tiles += 16x32 x 32x16 bf16, the
# bf16 GEMM's faster path where present; the int8 GEMM's blocks (quantized models):
# AMX-INT8 tiles (Sapphire Rapids and on), AVX512_VNNI `vpdpbusd` on zmm (Ice Lake,
# Zen 4 and on), AVX-VNNI on ymm (Alder Lake, Zen 5); none of them: exact AVX2.
BF16 = "avx512_bf16"
AMX_BF16 = "amx_bf16"
INT8 = ("amx_int8", "avx512_vnni", "avx_vnni")
FEATURES = (BF16, AMX_BF16) + INT8
# the `--cpu-isa` names: an ISA, or an ISA with features (a cross-compile for a CPU
# with AVX512_BF16, or with AMX-BF16 too)
NAMED = {"avx2": ("avx2", ()), "avx512": ("avx512", ()), "avx512_bf16": ("avx512", (BF16,)),
         "amx_bf16": ("avx512", (BF16, AMX_BF16)), "avx2_vnni": ("avx2", ("avx_vnni",)),
         "avx512_vnni": ("avx512", ("avx512_vnni",)),
         "amx_int8": ("avx512", ("amx_int8", "avx512_vnni"))}


def bf16_features(features) -> tuple[str, ...]:
    """The features a bf16 kernel built for a machine with `features` uses: AVX512_BF16,
    and AMX-BF16 where the machine has it."""
    return tuple(f for f in (BF16, AMX_BF16) if f in features)


@functools.lru_cache(maxsize=None)
def host_flags() -> frozenset[str]:
    """The CPU flags of this host (/proc/cpuinfo; empty where there is none)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def host_supports(isa: Isa) -> bool:
    return isa.host_flag in host_flags()


def runs_here(isa: Isa) -> bool:
    """Whether this CPU can run kernels built for `isa` (assumed so where the flags
    cannot be read)."""
    return not host_flags() or host_supports(isa)


def host_features() -> tuple[str, ...]:
    """The FEATURES this host has (in FEATURES' order)."""
    return tuple(f for f in FEATURES if f in host_flags())


def features_missing(features) -> tuple[str, ...]:
    """Those of `features` this host lacks (none where the flags cannot be read)."""
    flags = host_flags()
    return tuple(f for f in features if flags and f not in flags)


def host_best() -> Isa:
    """The widest ISA this CPU runs."""
    return AVX512 if host_supports(AVX512) else AVX2


def env_choice(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The ISA `HIDETC_CPU_ISA` names (None: unset or `auto`); a one-line ConfigError
    naming the variable for any other value."""
    choice = environ.get(ENV, "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ConfigError(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    return None if choice == "auto" else choice


@functools.lru_cache(maxsize=None)
def current() -> Isa:
    """The ISA the kernels of this process are built for (see the module docstring)."""
    choice = env_choice()
    return host_best() if choice is None else ISAS[choice]

