"""Run a CUDA artifact on the CPU with the emulator: the artifact's own CUDA sources
(kernels/src/*.cu) are compiled with the emulation header (cached by content), and the
manifest's launches run one after another on numpy buffers (arena, weights, inputs,
outputs), exactly as the CUDA runtime would run them on a GPU.

For tests and debugging on machines without a GPU: every thread of every block runs as
a fiber, so this is slow; use it on the tiny models.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

from hidetc.backends.runtime.cuda.manifest import parse_section
from hidetc.backends.runtime.emulator.emulator import EmulatedModule, build_emulated
from hidetc.backends.runtime.executor import check_inputs, collect_outputs
from hidetc.backends.runtime.weights import WeightEntry, read_weights


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
        self.uses_graph = False
        self.graph_unavailable: Optional[str] = "emulated: launches run one by one on the CPU"
        self._last_inputs: Optional[dict] = None

    def _pointer_arg(self, space: str, index: int, inputs, outputs) -> np.ndarray:
        if space == "input":
            return inputs[index].reshape(-1).view(np.uint8)
        if space == "output":
            return outputs[index].reshape(-1).view(np.uint8)
        base = self._arena if space == "arena" else self._weights
        return base[int(index):]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self._last_inputs = dict(inputs)
        return self._run(inputs, None)

    def _run(self, inputs: Mapping[str, np.ndarray], seconds: Optional[list[float]]
             ) -> dict[str, np.ndarray]:
        """One forward pass; with `seconds`, each launch's wall time is appended to it."""
        arrays = [a.copy() for a in check_inputs(self.manifest["inputs"], inputs)]
        outs = [np.zeros(o["shape"], o["dtype"]) for o in self.manifest["outputs"]]
        begin = time.perf_counter()
        for launch in self.section.launches:
            args = [self._pointer_arg(space, index, arrays, outs)
                    for space, index in launch.args]
            start = time.perf_counter()
            self.module.launch(launch.kernel, launch.grid, launch.block, args)
            if seconds is not None:
                seconds.append(time.perf_counter() - start)
        self.last_latency_ms = (time.perf_counter() - begin) * 1e3
        return collect_outputs(self.manifest, arrays, outs, self.constants)

    def measure(self, repeat: int = 3, warmup: int = 0) -> list[float]:
        """Wall milliseconds of `repeat` emulated passes on the last inputs given to
        `run` (zeros before any run): the CudaExecutor call, for code that times
        artifacts, with the CPU's emulation time in place of the GPU's."""
        inputs = self._last_inputs or {
            s["name"]: np.zeros(s["shape"], s["dtype"]) for s in self.manifest["inputs"]}
        times = []
        for _ in range(warmup + repeat):
            self._run(inputs, None)
            times.append(self.last_latency_ms)
        return times[warmup:]

    def profile(self, inputs: Mapping[str, np.ndarray], repeat: int = 1) -> list[float]:
        """Per launch, the median emulated wall milliseconds over `repeat` passes: the
        CPU's time to emulate it (for exercising profiling code without a GPU, not a
        prediction of the GPU's time)."""
        passes = []
        for _ in range(max(repeat, 1)):
            seconds: list[float] = []
            self._run(inputs, seconds)
            passes.append(seconds)
        return [float(v) * 1e3 for v in np.median(np.asarray(passes), axis=0)]
