"""Each kernel of an emulated cuda artifact against the reference interpreter, alone: the
per-kernel comparison of `hidetc run --emulate --sanitize --compare model.onnx`.

The compile's graph is rebuilt from the model file and the artifact's recorded config
(`api.optimized_graph`: the same passes, so the same value names), the reference
interpreter computes every value of it, and one emulated pass runs the launches with,
before each launch, the reference's values of everything it reads written where the
kernel reads them, and after it, the values it wrote (the manifest's `writes`)
compared with the reference's: so each kernel is judged on exact inputs, and errors do
not carry from one kernel into the next.

Tolerance per operation (norm-wise relative error of the written value): float32
1e-5 (a kernel's own rounding and summation order), float16 5e-3 (ten half ulps: the
kernels compute in float32 and round once, numpy's float16 reference rounds more
often); integers and booleans exactly. A value several launches write (the slices of a
Concat) is compared after its last writer. Reports the first kernel that differs.
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Mapping

import numpy as np

from hidetc.driver.api import Model, optimized_graph
from hidetc.driver.config import CompileConfig
from hidetc.driver.verify import compare
from hidetc.frontend.onnx.importer import load_model
from hidetc.graph.reference import run_graph

RTOL = {"float32": 1e-5, "float16": 5e-3, "float64": 1e-12, "bfloat16": 4e-2}


def _config(manifest: dict) -> CompileConfig:
    fields = CompileConfig.__dataclass_fields__
    return CompileConfig(**{k: v for k, v in manifest.get("config", {}).items() if k in fields})


def check_kernels(model: Model, model_path: str | os.PathLike,
                  inputs: Mapping[str, np.ndarray]) -> list[str]:
    """The hazard line of the first kernel whose output differs from the reference's
    given the reference's inputs (see the module docstring), else []."""
    manifest = model.manifest
    cfg = _config(manifest)
    graph = optimized_graph(load_model(Path(model_path), shapes=cfg.shapes), cfg,
                            manifest["target"])
    reference = run_graph(graph, inputs, keep_all=True)
    kernels = manifest["kernels"]
    last_writer = {}
    for step, kernel in enumerate(kernels):
        for value in kernel.get("writes", []):
            last_writer[value] = step
    writers = Counter(v for k in kernels for v in k.get("writes", []))
    hazards: list[str] = []

    def hook(when: str, step: int, place) -> None:
        if hazards:
            return
        kernel = kernels[step]
        writes = set(kernel.get("writes", []))
        if when == "before":
            for value in set(kernel["args"]) - writes:
                view = place(value)
                want = reference.get(value)
                if view is not None and want is not None and view.nbytes == want.nbytes:
                    view[...] = np.ascontiguousarray(want).reshape(-1).view(np.uint8)
            return
        for value in sorted(writes):
            view, want = place(value), reference.get(value)
            if view is None or want is None or last_writer[value] != step:
                continue
            got = view.view(want.dtype).reshape(want.shape)
            rtol = RTOL.get(str(want.dtype), 0.0)
            report = compare({value: got}, {value: want}, rtol)
            if report["status"] != "passed":
                entry = report["outputs"][value]
                what = (f"relative error {entry['rel_error']:.3g} > {rtol:g}"
                        if "rel_error" in entry else
                        f"{entry.get('mismatches')} mismatched elements")
                shared = f" (written by {writers[value]} launches)" if writers[value] > 1 else ""
                hazards.append(f"kernel {kernel['name']} ({kernel['op']} {kernel['node']!r}): "
                               f"{value!r}{shared} differs from the reference interpreter's "
                               f"given the same inputs ({what})")
                return

    model.run_with_hook(inputs, hook)
    return hazards
