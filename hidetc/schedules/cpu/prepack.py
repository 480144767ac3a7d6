"""Constant weights packed at compile time, for the cpu GEMM templates.

A Conv's weights (the A operand of its implicit GEMM) and a MatMul's B are usually
graph constants: the plan packs them once into the micro-kernel's panel layout
(`conv.prepack_weights`, `matmul.prepack_weights`) and builds the kernel to read them
so (`build(..., prepacked=True)`), instead of packing them on every call.

`Prepacked(template)` is that choice as a template of its own, for the tuner: the same
space and default, `build` makes the prepacked kernel (for the configs `can_prepack`
accepts; the others build as usual) and `prepare_inputs` packs a measuring run's random
weights for a config, so candidates are timed as they will run. Its name
(`<template>+prepacked`) keys its own tuning records. `for_constant_weights(template)`
gives the wrapper of a template that has one, else None;
`hidetc.schedules.template.base_template` unwraps (its `base`).
"""
from __future__ import annotations

import importlib
from typing import Any, Sequence

from hidetc.compute.task import Task
from hidetc.schedules.template import Target

WEIGHT_INPUT = 1   # the operand packed: Conv's W, MatMul's B
# base template name -> module with can_prepack / prepack_tag / prepack_weights
MODULES = {"cpu.conv": "hidetc.schedules.cpu.conv", "cpu.matmul": "hidetc.schedules.cpu.matmul",
           "cpu.matmul.bf16": "hidetc.schedules.cpu.matmul_bf16",
           "cpu.conv.bf16": "hidetc.schedules.cpu.conv_bf16",
           "cpu.matmul.int8": "hidetc.schedules.cpu.matmul_int8",
           "cpu.conv.int8": "hidetc.schedules.cpu.conv_int8"}


class Prepacked:
    """`base`'s prepacked form (`base`: the template it wraps, for
    `hidetc.schedules.template.base_template`)."""

    def __init__(self, template):
        self.base = template
        self.name = f"{template.name}+prepacked"
        self.module_name = MODULES[template.name]

    @property
    def module(self):
        return importlib.import_module(self.module_name)

    def space(self, task: Task, target: Target) -> Sequence[Any]:
        return self.base.space(task, target)

    def default(self, task: Task, target: Target) -> Any:
        return self.base.default(task, target)

    def short_list(self, task: Task, target: Target) -> Sequence[Any]:
        pick = getattr(self.base, "short_list", None)
        return pick(task, target) if pick is not None else ()

    def kernel_key(self, task: Task, config: Any, target: Target) -> Any:
        key = getattr(self.base, "kernel_key", None)
        return key(task, config, target) if key is not None else config

    def packs_weights(self, task: Task, config: Any) -> bool:
        """Whether `config`'s kernel reads its weights packed at compile time (what the
        plan asks of a template whose anchor has constant weights; a template without
        this method never does)."""
        return self.module.can_prepack(task, config)

    def packed_name(self, weight: str, task: Task, config: Any) -> str:
        """The constant holding `weight` packed for `config`."""
        return f"{weight}.packed_{self.module.prepack_tag(task, config)}"

    def build(self, task: Task, config: Any, name: str, target: Target, **options):
        options.setdefault("prepacked", self.packs_weights(task, config))
        return self.base.build(task, config, name, target, **options)

    def prepare_inputs(self, task: Task, config: Any, inputs: list) -> list:
        """The task's inputs (all of them, in order) with the weights packed for
        `config` where its kernel reads them packed."""
        if not self.packs_weights(task, config):
            return inputs
        out = list(inputs)
        out[WEIGHT_INPUT] = self.module.prepack_weights(task, config, inputs[WEIGHT_INPUT])
        return out

    def __reduce__(self):      # pickled into tuning jobs by its base template
        return (Prepacked, (self.base,))


def for_constant_weights(template) -> Prepacked | None:
    """The prepacked form of `template` for an anchor whose weights are a constant."""
    if template is None or getattr(template, "name", None) not in MODULES:
        return None
    return Prepacked(template)
