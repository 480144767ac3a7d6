"""Each kernel of an artifact (cpu, or cuda in the emulator) against the reference
interpreter, alone: the per-kernel comparison of `hidetc run --emulate --sanitize
--compare model.onnx`, and the kernel `hidetc run --compare` names when an output
misses the artifact's tolerance.

The compile's graph is rebuilt from the model file and the artifact's recorded config
and machine (`CompileContext.optimize`: the same passes, so the same value names), the reference
interpreter computes every value of it, and `divergence.kernel_errors` judges each
kernel on exact inputs (one pass, launch by launch: in the emulator, or on the CPU).

Tolerance per operation (norm-wise relative error of the written value): float32
1e-5 (a kernel's own rounding and summation order), float16 5e-3 (ten half ulps: the
kernels compute in float32 and round once, numpy's float16 reference rounds more
often); integers and booleans exactly. A value several launches write (the slices of a
Concat) is compared after its last writer. Reports the first kernel that differs.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np

from hidetc.driver.config import CompileConfig
from hidetc.driver.context import CompileContext
from hidetc.driver.divergence import KernelError, kernel_errors, launches_of
from hidetc.driver.model import Model
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.reference import run_graph
from hidetc.target import default_target, target_from_facts

RTOL = {"float32": 1e-5, "float16": 5e-3, "float64": 1e-12, "bfloat16": 4e-2}


def _config(manifest: dict) -> CompileConfig:
    fields = CompileConfig.__dataclass_fields__
    return CompileConfig(**{k: v for k, v in manifest.get("config", {}).items() if k in fields})


def _options(cfg: CompileConfig) -> dict:
    """The options that shape the compile's graph (the graph passes read them)."""
    return {"precision": cfg.precision, "layout": cfg.layout, "verify_ir": cfg.verify_ir}


def check_kernels(model: Model, model_path: str | os.PathLike,
                  inputs: Mapping[str, np.ndarray]) -> list[str]:
    """The hazard line of the first kernel whose output differs from the reference's
    given the reference's inputs (see the module docstring), else []."""
    manifest = model.manifest
    cfg = _config(manifest)
    machine = (target_from_facts(manifest["machine"]) if manifest.get("machine")
                else default_target(manifest["target"]))
    ctx = CompileContext.for_machine(machine, **_options(cfg))
    graph = ctx.optimize(load_model(Path(model_path), **cfg.bindings))
    reference = run_graph(graph, inputs, keep_all=True)

    def over(error: KernelError) -> bool:
        return error.exceeds(RTOL.get(str(np.asarray(reference[error.value]).dtype), 0.0))

    errors = kernel_errors(launches_of(manifest), model.run_with_hook, inputs, reference,
                           stop=over)
    bad = [e for e in errors if over(e)]
    if not bad:
        return []
    e = bad[0]
    rtol = RTOL.get(str(np.asarray(reference[e.value]).dtype), 0.0)
    shared = f" (written by {e.writers} launches)" if e.writers > 1 else ""
    return [f"kernel {e.kernel} ({e.op} {e.node!r}): {e.value!r}{shared} differs from the "
            f"reference interpreter's given the same inputs ({e.describe(rtol)})"]
