"""The machine a compile is for: every machine fact a decision depends on, in one value
that the compile detects once (or is told, for a cross-compile) and passes down to the
templates' `space`/`default`/`build`, the task shapes, the tuner and the manifest.

- `CpuTarget`: the vector ISA the kernels are written for, the cores the kernels' parallel
  loops are shaped for, and the cache sizes. `detect_cpu(cores=None)` reads this host:
  the cores this process may run on (its CPU affinity, not the machine's core count),
  the caches from sysfs (the per-core L1d and L2, the shared L3), the ISA from
  `cpu_isa.host_best()`; `cores=N` cross-compiles the task shapes for an N-core machine,
  `isa=` the kernels for another vector ISA (the micro-kernels, spaces and gcc flags
  all follow the target's).
- `CudaTarget`: the architecture and the per-block and per-SM limits. `cuda_target`
  builds it from the visible GPU's reported attributes when there is one, else from
  `KNOWN_GPUS` by name (`--gpu h100-sxm`), else from the arch's reference GPU
  (`ARCH_REFERENCE`: the limits of that arch, its SM count from the GPU named).

Nothing here runs at import time: a host fact enters a compile only through
`detect_cpu` or a device query, and the manifest records the target it was built for
(`facts()`), so loading it elsewhere can warn or refuse. Templates must take every
machine fact from the target they are given.
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Mapping, Optional

from hidetc import cpu_isa
from hidetc.errors import ConfigError

KIB, MIB = 1024, 1024 * 1024
# Cache sizes assumed where sysfs does not say (a container without /sys, another OS):
# the smallest of current x86 server cores, so blocking errs towards fitting.
FALLBACK_CACHES = {"l1_bytes": 32 * KIB, "l2_bytes": 512 * KIB, "l3_bytes": 0}


@dataclass(frozen=True)
class Target:
    """What every target has: its kind ("cpu" or "cuda")."""
    kind: str

    def facts(self) -> dict:
        """The manifest's `target` record (plain values)."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class CpuTarget(Target):
    kind: str = "cpu"
    isa: str                       # a cpu_isa.ISAS name
    cores: int                     # what the parallel loops' task shapes are built for
    l1_bytes: int = FALLBACK_CACHES["l1_bytes"]    # per core (data)
    l2_bytes: int = FALLBACK_CACHES["l2_bytes"]    # per core
    l3_bytes: int = FALLBACK_CACHES["l3_bytes"]    # shared; 0: unknown or none
    # the machine's cpu_isa.FEATURES (AVX512_BF16, AMX-BF16, VNNI): detected, or implied
    # by a named ISA for a cross-compile
    features: tuple[str, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, "features", tuple(self.features))
        if self.cores < 1:
            raise ConfigError(f"a cpu target needs at least 1 core, got {self.cores}")
        if self.isa not in cpu_isa.ISAS:
            raise ConfigError(f"unknown cpu ISA {self.isa!r}; expected one of "
                              f"{', '.join(cpu_isa.ISAS)}")

    @property
    def vector_lanes(self) -> int:
        return cpu_isa.ISAS[self.isa].lanes

    def describe(self) -> str:
        return f"cpu {self.isa}, {self.cores} core{'s' if self.cores != 1 else ''}"


@dataclass(frozen=True, kw_only=True)
class CudaTarget(Target):
    """The defaults are what every arch from sm_80 on shares; the rest is per GPU."""
    kind: str = "cuda"
    name: str
    arch: str
    sms: int
    shared_optin_bytes: int            # dynamic shared memory per block (opt-in maximum)
    shared_per_sm_bytes: int
    threads_per_sm: int
    l2_bytes: int
    max_threads: int = 1024            # per block
    shared_bytes: int = 48 * KIB       # static shared memory per block
    max_registers: int = 255           # per thread
    registers_per_block: int = 64 * KIB
    registers_per_sm: int = 64 * KIB
    max_blocks_per_sm: int = 32
    # performance facts (the cost model's, `schedules/cuda/cost.py`): boost clock, DRAM
    # bandwidth, and per SM per clock the dense f16 tensor-core FLOPs with f32
    # accumulation and the FP32 FLOPs (an FMA counts 2). Defaults: the H200's.
    clock_mhz: int = 1980
    dram_gbps: int = 4800
    tensor_flops_per_clk: int = 4096
    simt_flops_per_clk: int = 256

    def describe(self) -> str:
        return f"cuda {self.name} ({self.arch}, {self.sms} SMs)"

    def blocks_per_sm(self, threads: int, registers: int, shared_bytes: int) -> int:
        """Resident blocks per SM of a kernel with `threads` per block, `registers` per
        thread and `shared_bytes` per block (static + dynamic): the least of the block,
        thread, register and shared-memory limits (registers allocated per warp in
        units of 256, shared memory with 1 KiB reserved per block, as the CUDA
        occupancy calculator does for sm_80 and newer); 0 when one block cannot fit."""
        warps = -(-max(threads, 1) // 32)
        per_warp = -(-max(registers, 1) * 32 // 256) * 256
        by_registers = (self.registers_per_sm // per_warp) // warps
        by_threads = self.threads_per_sm // (warps * 32)
        by_shared = (self.shared_per_sm_bytes // (shared_bytes + 1024)
                     if shared_bytes else self.max_blocks_per_sm)
        return max(0, min(self.max_blocks_per_sm, by_registers, by_threads, by_shared))


def _gpu(name: str, arch: str, sms: int, optin_kib: int, per_sm_kib: int, threads: int,
         l2_mib: int, blocks: int, clock_mhz: int, dram_gbps: int, tensor: int,
         simt: int) -> CudaTarget:
    return CudaTarget(name=name, arch=arch, sms=sms, shared_optin_bytes=optin_kib * KIB,
                      shared_per_sm_bytes=per_sm_kib * KIB, threads_per_sm=threads,
                      l2_bytes=l2_mib * MIB, max_blocks_per_sm=blocks, clock_mhz=clock_mhz,
                      dram_gbps=dram_gbps, tensor_flops_per_clk=tensor,
                      simt_flops_per_clk=simt)


# The limits of the GPUs users run (NVIDIA's data sheets and CUDA C Programming Guide
# tables per compute capability); `--gpu NAME` picks one for a cross-compile. After the
# limits: boost MHz, DRAM GB/s, dense f16 (f32-accumulating) tensor FLOPs and FP32
# FLOPs per SM per clock (the GeForce RTX 4090 accumulates f32 at half rate).
KNOWN_GPUS: dict[str, CudaTarget] = {
    "a100": _gpu("NVIDIA A100", "sm_80", 108, 163, 164, 2048, 40, 32, 1410, 2039, 2048, 128),
    "a10": _gpu("NVIDIA A10", "sm_86", 72, 99, 100, 1536, 6, 16, 1695, 600, 1024, 256),
    "l4": _gpu("NVIDIA L4", "sm_89", 58, 99, 100, 1536, 48, 24, 2040, 300, 1024, 256),
    "l40s": _gpu("NVIDIA L40S", "sm_89", 142, 99, 100, 1536, 96, 24, 2520, 864, 1024, 256),
    "rtx4090": _gpu("NVIDIA GeForce RTX 4090", "sm_89", 128, 99, 100, 1536, 72, 24, 2520,
                    1008, 512, 256),
    "h100-pcie": _gpu("NVIDIA H100 PCIe", "sm_90", 114, 227, 228, 2048, 50, 32, 1755, 2000,
                      4096, 256),
    "h100-sxm": _gpu("NVIDIA H100 SXM", "sm_90", 132, 227, 228, 2048, 50, 32, 1980, 3350,
                     4096, 256),
    "h200": _gpu("NVIDIA H200", "sm_90", 132, 227, 228, 2048, 50, 32, 1980, 4800, 4096, 256),
}
# An arch alone (`--arch sm_XX`, no GPU named or visible): that arch's limits, with the
# SM count and L2 of the GPU named here.
ARCH_REFERENCE = {"sm_80": "a100", "sm_86": "a10", "sm_87": "a10", "sm_89": "l40s",
                  "sm_90": "h200", "sm_90a": "h200"}


def gpu_names() -> list[str]:
    return sorted(KNOWN_GPUS)


def cuda_target(arch: Optional[str] = None, gpu: Optional[str] = None,
                device: Optional[Mapping[str, int]] = None) -> CudaTarget:
    """The CudaTarget of a compile: `device` (the visible GPU's attributes, from the
    CUDA runtime: name, arch, sms, shared_optin_bytes, ...) when given, else the known
    GPU `gpu`, else the reference GPU of `arch` (default sm_90). A one-line ConfigError
    for a GPU name not in the table, or a name whose arch contradicts `arch`."""
    if device:
        known = {f.name for f in fields(CudaTarget)}
        base = KNOWN_GPUS[ARCH_REFERENCE.get(device.get("arch", ""), "h200")]
        return replace(base, **{k: v for k, v in device.items() if k in known and v})
    if gpu is not None:
        key = gpu.strip().lower()
        if key not in KNOWN_GPUS:
            raise ConfigError(f"--gpu {gpu!r}: unknown GPU; known: {', '.join(gpu_names())}")
        target = KNOWN_GPUS[key]
        if arch is not None and arch != target.arch:
            raise ConfigError(f"--gpu {gpu} is {target.arch}, but --arch says {arch}")
        return target
    arch = arch or "sm_90"
    reference = ARCH_REFERENCE.get(arch)
    if reference is None:
        newest = max(ARCH_REFERENCE, key=lambda a: int("".join(c for c in a if c.isdigit())))
        reference = ARCH_REFERENCE[newest]
    return replace(KNOWN_GPUS[reference], arch=arch,
                   name=f"{arch} (limits of the {KNOWN_GPUS[reference].name})")


# ---------------------------------------------------------------- this host's CPU


def host_memory_bytes() -> Optional[int]:
    """This host's physical memory (None where the OS does not say): what a compile
    that runs the model here (tuning, verification) can use."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask; os.cpu_count elsewhere)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


def _size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": KIB, "M": MIB, "G": 1024 * MIB}.get(text[-1:], 1)
    return int(text.rstrip("KMG") or 0) * scale


def host_caches(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> dict[str, int]:
    """{l1_bytes, l2_bytes, l3_bytes} of cpu0 from sysfs (data/unified caches only);
    FALLBACK_CACHES for what sysfs does not say."""
    found = dict(FALLBACK_CACHES)
    try:
        entries = sorted(root.glob("index*"))
        for entry in entries:
            kind = (entry / "type").read_text().strip()
            if kind not in ("Data", "Unified"):
                continue
            level = int((entry / "level").read_text())
            if level in (1, 2, 3):
                found[f"l{level}_bytes"] = _size((entry / "size").read_text())
    except (OSError, ValueError):
        pass
    return found


def detect_cpu(cores: Optional[int] = None, isa: Optional[str] = None) -> CpuTarget:
    """This host's CpuTarget; `cores` (a cross-compile for another core count) and `isa`
    override what is detected (`isa`: a `cpu_isa.NAMED` name, which sets the features:
    `avx512_bf16` is AVX-512 with AVX512_BF16)."""
    if cores is not None and cores < 1:
        raise ConfigError(f"--cpu-cores {cores}: expected at least 1")
    if isa is None:
        isa, features = cpu_isa.host_best().name, cpu_isa.host_features()
    else:
        isa, features = cpu_isa.NAMED[isa]
    return CpuTarget(isa=isa, features=features,
                     cores=cores if cores is not None else usable_cores(), **host_caches())


def simt(kind: str) -> bool:
    """Whether the kernels of a target of `kind` run as SIMT launches -- blocks of
    threads with shared memory and thread/block built-ins, their task mappings unrolled
    -- rather than as host loops (the fact the tensor-program passes ask of a kernel's
    `target` attribute)."""
    return kind == "cuda"


def default_target(kind: str, arch: Optional[str] = None) -> Target:
    """A kind's target when none is given: this host's cpu (detected now), or the
    reference GPU of the cuda arch (`cuda_target(arch)`; sm_90 without one)."""
    if kind == "cpu":
        return detect_cpu()
    if kind == "cuda":
        return cuda_target(arch if arch and arch.startswith("sm_") else None)
    raise ConfigError(f"unknown target {kind!r}; expected cpu or cuda")


def target_from_facts(facts: Mapping) -> Target:
    """The Target a manifest's `target` record describes."""
    cls = CudaTarget if facts.get("kind") == "cuda" else CpuTarget
    known = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in facts.items() if k in known})
