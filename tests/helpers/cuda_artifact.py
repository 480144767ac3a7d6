"""A hand-made two-kernel CUDA artifact for the runtime tests (fake driver and real GPU):
x -> scale_bias (x * w[:N] + w[N:]) -> relu_reverse (relu, reversed, staged in 64 KiB
of dynamic shared memory) -> y, its launches and the numpy result."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from helpers.threads import in_threads

from hidetc.backends.runtime.weights import write_weights

N = 16384                     # floats: relu_reverse stages them in 64 KiB of shared memory


def launch(kernel, grid, block, args, shared=0):
    return {"kernel": kernel, "module": "model", "grid": grid, "block": block,
            "shared_bytes": shared, "args": args}


def pipeline(w_offset, extra=()):
    return [launch("scale_bias", [N // 256], [256],
                    [["input", 0], ["weights", w_offset], ["arena", 0], ["i32", N]]),
            *extra,
            launch("relu_reverse", [1], [256], [["arena", 0], ["output", 0], ["i32", N]],
                    shared=4 * N)]


def artifact(root: Path, cubins: dict, launches=None, ptx=None, arena=4 * N) -> dict:
    """A hand-made cuda manifest + weights.bin (w = scale then bias) under `root`."""
    w = np.linspace(-1, 1, 2 * N, dtype=np.float32)
    entries = write_weights(root / "weights.bin", {"w": w})
    module = {"name": "model", "cubins": cubins}
    if ptx:
        module["ptx"] = ptx
    return {"target": "cuda",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [N]}],
            "outputs": [{"name": "y", "dtype": "float32", "shape": [N]}],
            "memory": {"arena_bytes": arena, "total_bytes": arena, "offsets": {}},
            "weights": {"file": "weights.bin",
                        "entries": {k: e.to_dict() for k, e in entries.items()}},
            "cuda": {"modules": [module],
                     "launches": launches or pipeline(entries["w"].offset)}}


def expected(x: np.ndarray) -> np.ndarray:
    w = np.linspace(-1, 1, 2 * N, dtype=np.float32)
    return np.maximum(x * w[:N] + w[N:], 0)[::-1]


def hammer(executor, threads: int = 4, runs: int = 10) -> list[str]:
    """`threads` threads x `runs` passes of `executor.run`, each thread on inputs of its
    own; what went wrong (a wrong result, an exception), as lines."""
    problems: list[str] = []

    def work(k: int) -> None:
        x = np.random.default_rng(100 + k).standard_normal(N, dtype=np.float32)
        for r in range(runs):
            if not np.array_equal(executor.run({"x": x})["y"], expected(x)):
                problems.append(f"thread {k} run {r}: wrong result")
    problems += [f"{type(e).__name__}: {e}" for e in in_threads(threads, work)]
    return problems
