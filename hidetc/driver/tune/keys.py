"""What a tuning record is keyed by: the anchor task (a digest of it), the template, and
the facts of the machine and toolchain that change a config's rank. The store itself is
`hidetc.driver.tune.records`; a target's backend (`hidetc.driver.backend`) says which
of these facts key its records (the cpu: ISA and cores, `cpu_arch`; cuda: the arch and
GPU) and which toolchain identity (`gcc_version`, `nvcc_version`).
"""
from __future__ import annotations

import functools
import hashlib
import platform
from dataclasses import dataclass, field, replace
from pathlib import Path

from hidetc import __version__, cpu_isa
from hidetc.backends.toolchain.gcc import compiler_identity, find_compiler
from hidetc.backends.toolchain.nvcc import nvcc_identity
from hidetc.compute.task import Task
from hidetc.graph.ir import freeze_attr
from hidetc.target import CpuTarget

KEY_FIELDS = ("template", "task", "device", "arch", "toolchain", "hidetc")


def task_digest(task: Task) -> str:
    """sha256 of the task's repr, attrs and params normalized (numpy values -> tuples)."""
    canonical = replace(task, attrs=freeze_attr(task.attrs), params=freeze_attr(task.params))
    return hashlib.sha256(repr(canonical).encode()).hexdigest()


@dataclass(frozen=True)
class RecordKey:
    """What a record is for; equal keys (signature aside) share one record."""
    template: str
    task: str                  # task_digest(task)
    device: str
    arch: str
    toolchain: str
    hidetc: str = __version__
    signature: str = field(default="", compare=False)

    def columns(self) -> tuple[str, ...]:
        return tuple(getattr(self, f) for f in KEY_FIELDS)


def _signature(task: Task) -> str:
    attrs = ", ".join(f"{k}={v!r}" for k, v in task.attrs)
    return task.signature() + (f" {{{attrs}}}" if attrs else "")


def key_for(task: Task, template_name: str, device: str, arch: str, toolchain: str,
            space: str = "") -> RecordKey:
    """The key of `task`'s record; `space` (a digest of the candidate space, see
    `search.space_digest`) joins hidetc's version: `0.1.0+space.<digest>`."""
    version = f"{__version__}+space.{space}" if space else __version__
    return RecordKey(template_name, task_digest(task), device, arch, toolchain,
                     version, _signature(task))


@functools.lru_cache(maxsize=None)
def cpu_device() -> str:
    """`cpu:<model name>` from /proc/cpuinfo, else from the platform module."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                return "cpu:" + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu:" + (platform.processor() or platform.machine() or "unknown")


@functools.lru_cache(maxsize=None)
def cpu_arch(target: CpuTarget) -> str:
    """The facts of a cpu target that change a config's rank, as a record key's `arch`:
    the instruction set (x86-64-avx2 or x86-64-avx512: configs measured with one ISA's
    kernels are not the other's) and the cores the task shapes are built for
    ("x86-64-avx512/16c"): a cross-compile for 16 cores takes the winners measured on a
    16-core machine of that ISA. The bf16 features follow the ISA
    ("x86-64-avx512+avx512_bf16+amx_bf16/2c"): a bf16 kernel runs on AMX tiles where the
    machine has them and on vdpbf16ps where not, so their winners differ; so do the int8
    features (AMX-INT8, AVX512_VNNI, AVX-VNNI: the int8 GEMM's block helpers)."""
    machine = platform.machine().lower()
    isa = f"x86-64-{target.isa}" if machine in ("x86_64", "amd64") else machine or "unknown"
    used = cpu_isa.bf16_features(target.features) + \
        tuple(f for f in cpu_isa.INT8 if f in target.features)
    features = "".join(f"+{f}" for f in used)
    return f"{isa}{features}/{target.cores}c"


@functools.lru_cache(maxsize=None)
def gcc_version() -> str:
    """gcc's first `--version` line; the compiler's path is left out so machines with
    the compiler installed elsewhere match."""
    lines = compiler_identity(find_compiler()).splitlines()[1:]
    pick = lines[0].strip() if lines else ""
    return pick or "unknown"


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    """`nvcc: ` and nvcc's release line (path left out, as `gcc_version`)."""
    lines = nvcc_identity().splitlines()[1:]
    release = [ln for ln in lines if "release" in ln]
    pick = (release or [ln for ln in lines if ln.strip()] or [""])[-1].strip()
    return "nvcc: " + pick if pick else "unknown"
