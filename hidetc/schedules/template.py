"""The template interface: a schedule template for one family of tasks.

A template has a hardware-centric schedule space: `space(task, target)` lists frozen,
hashable `Config`s that fit the target's limits (never more than `MAX_SPACE`, and
independent of the input shape apart from pruning configs that break hardware limits);
`default(task, target)` is the config used without tuning; `build(task, config, name)`
returns the kernel `Function`. Kernels must be correct for every config on every shape
(predicated or clamped loads and stores), so the tuner may pick any of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from hidetc.schedules.task import Task
from hidetc.tir.ir import Function

MAX_SPACE = 200


@dataclass(frozen=True)
class Target:
    """What templates may rely on. CPU: vector width in f32 lanes, cores, cache sizes."""
    kind: str = "cpu"
    vector_lanes: int = 8         # AVX2: 8 x f32
    cores: int = 2
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024


@dataclass(frozen=True)
class CudaTarget(Target):
    """The CUDA limits templates rely on: a Target with the architecture and per-SM and
    per-block limits (the H200's SM count by default)."""
    kind: str = "cuda"
    arch: str = "sm_90"
    sms: int = 132
    max_threads: int = 1024
    shared_bytes: int = 48 * 1024      # static shared memory per block
    max_registers: int = 255           # per thread
    registers_per_block: int = 64 * 1024


def target_for(kind: str, arch: str | None = None) -> Target:
    """The Target templates see for a compile target ("cpu" or "cuda" + arch)."""
    if kind == "cpu":
        return Target()
    return CudaTarget(arch=arch) if arch else CudaTarget()


class Config(Protocol):
    """A frozen dataclass; its fields are the schedule's knobs."""


class Template(Protocol):
    name: str

    def space(self, task: Task, target: Target) -> Sequence[Config]: ...

    def default(self, task: Task, target: Target) -> Config: ...

    def build(self, task: Task, config: Config, name: str) -> Function: ...
