"""Run a CUDA artifact on the CPU with the emulator: the artifact's own CUDA sources
(kernels/src/*.cu) are compiled with the emulation header (cached by content), and the
manifest's launches run one after another on numpy buffers (arena, weights, inputs,
outputs), exactly as the CUDA runtime would run them on a GPU.

For tests and debugging on machines without a GPU: every thread of every block runs as
a fiber, so this is slow; use it on the tiny models.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from hidetc.runtime.cuda.manifest import parse_section
from hidetc.runtime.emulator.emulator import EmulatedModule, build_emulated
from hidetc.runtime.executor import check_inputs, collect_outputs
from hidetc.runtime.weights import WeightEntry, read_weights


class EmulatedCudaExecutor:
    def __init__(self, path: Path, manifest: dict):
        self.manifest = manifest
        self.section = parse_section(manifest, str(path / "manifest.yaml"))
        sources = {p.stem: p.read_text() for p in sorted((path / "kernels" / "src").glob("*.cu"))}
        self.module = EmulatedModule(build_emulated(sources))
        weights = manifest["weights"]
        entries = {k: WeightEntry(**v) for k, v in weights["entries"].items()}
        blob, self.constants = read_weights(path / weights["file"], entries, mmap=False)
        self._weights = blob
        self._arena = np.zeros(max(int(manifest["memory"]["arena_bytes"]), 64), np.uint8)
        self.last_latency_ms = 0.0

    def _pointer_arg(self, space: str, index: int, inputs, outputs) -> np.ndarray:
        if space == "input":
            return inputs[index].reshape(-1).view(np.uint8)
        if space == "output":
            return outputs[index].reshape(-1).view(np.uint8)
        base = self._arena if space == "arena" else self._weights
        return base[int(index):]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = [a.copy() for a in check_inputs(self.manifest["inputs"], inputs)]
        outs = [np.zeros(o["shape"], o["dtype"]) for o in self.manifest["outputs"]]
        for launch in self.section.launches:
            args = [self._pointer_arg(space, index, arrays, outs)
                    for space, index in launch.args]
            self.module.launch(launch.kernel, launch.grid, launch.block, args)
        return collect_outputs(self.manifest, arrays, outs, self.constants)
