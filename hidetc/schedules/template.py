"""The template interface: a schedule template for one family of tasks.

A template has a hardware-centric schedule space: `space(task, target)` lists frozen,
hashable `Config`s that fit the target's limits (never more than `MAX_SPACE`, and
independent of the input shape apart from pruning configs that break hardware limits);
`default(task, target)` is the config used without tuning; `build(task, config, name,
target)` returns the kernel `Function`. The target (`hidetc.target`) is the machine the
kernel is for: every machine fact a template uses (cores, vector lanes, SMs, shared
memory) comes from it, never from the host or a constant. Kernels must be correct for
every config on every shape (predicated or clamped loads and stores), so the tuner may
pick any of them.

A template whose configs can be shaped by a size that a range of sizes leaves open
(split-K's workspace by the tile count) says how a config builds over the range in its
optional `over_range(task, config)`; `config_over_range` applies it to a task with
symbolic sizes, where the tuner and the selection pick configs at the build's hint.

A template may wrap another one (the cpu's `prepack.Prepacked`: the same space and
default, the kernel built to read prepacked weights); the wrapper names the template it
wraps in its `base` attribute, and `base_template` unwraps it.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from hidetc.compute.task import Task
from hidetc.target import CpuTarget, CudaTarget, Target
from hidetc.tir.ir import Function

__all__ = ["MAX_SPACE", "Config", "CpuTarget", "CudaTarget", "Target", "Template",
           "base_template", "config_over_range"]

MAX_SPACE = 200


class Config(Protocol):
    """A frozen dataclass; its fields are the schedule's knobs."""


class Template(Protocol):
    name: str

    def space(self, task: Task, target: Target) -> Sequence[Config]: ...

    def default(self, task: Task, target: Target) -> Config: ...

    def build(self, task: Task, config: Config, name: str, target: Target) -> Function: ...


def base_template(template):
    """The template a wrapper template wraps (its `base`), else `template` itself (None
    stays None). Assumes a wrapper's `base` is a plain template: one level to unwrap."""
    return getattr(template, "base", template)


def config_over_range(template, task: Task, config):
    """`config` as `template` builds it for `task` over its ranges: the template's
    `over_range` where the task has symbolic sizes and the template has one, else
    `config` itself."""
    fit = getattr(template, "over_range", None)
    return fit(task, config) if fit is not None and task.symbolic else config
