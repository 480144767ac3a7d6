"""CUDA rules for GroupNormalization and MeanVarianceNormalization: one thread per row
(256-thread blocks, tail guarded), the row's three serial passes and numerics shared
with the CPU rules (`hidetc.schedules.common.norm.build_norm`, which documents them);
float16 and bfloat16 storage is widened to float32 for the statistics and rounded once
per output.
A simple correct schedule: rows are long (C / num_groups x spatial elements), so the
reduction template's warp-per-row layout would be faster.
"""
from __future__ import annotations

from hidetc.compute.task import Task
from hidetc.schedules.common.norm import build_norm as _build_norm
from hidetc.tir.ir import Function


def build_norm(task: Task, name: str) -> Function:
    return _build_norm(task, name, "cuda")
