"""A loaded artifact, the Python API's `load(out_dir) -> Model`: `run` from any number
of threads, a context of the caller's own (`context(threads)`), per-launch profiles.

Assumes: the executors of `backends.runtime` (one per target, and the emulator), each
an `Executor` of `runtime.contexts`. Guarantees: a `Model` is safe to call from any
thread -- each pass runs on an execution context of its own (pooled; at most
`max_contexts` at once, a caller beyond waits), the weights are loaded once and
shared, the outputs are fresh arrays per call -- and a pass that raises leaves the
others correct (its context is dropped, not reused).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

import numpy as np

from hidetc.backends.runtime.artifact import profile_rows, read_manifest
from hidetc.backends.runtime.contexts import OwnContext
from hidetc.backends.runtime.select import make_executor
from hidetc.errors import ArtifactError


class Model:
    """A loaded artifact. `run({name: array}) -> {name: array}`, from any thread."""

    def __init__(self, out_dir: str | os.PathLike, *, verify_checksums: bool = True,
                 emulate: bool = False, sanitize: bool = False,
                 max_contexts: Optional[int] = None, runtime: str = "python"):
        self.path = Path(out_dir)
        self.manifest = read_manifest(self.path, verify_checksums=verify_checksums)
        self.runtime = runtime
        self._executor = make_executor(self.path, self.manifest, emulate=emulate,
                                       sanitize=sanitize, max_contexts=max_contexts,
                                       runtime=runtime)

    @property
    def inputs(self) -> list[dict]:
        return self.manifest["inputs"]

    @property
    def outputs(self) -> list[dict]:
        return self.manifest["outputs"]

    @property
    def target(self) -> str:
        return self.manifest["target"]

    @property
    def last_latency_ms(self) -> float:
        """The latency of the calling thread's last `run`."""
        return self._executor.last_latency_ms

    @property
    def uses_graph(self) -> bool:
        """True where each run replays a captured CUDA graph (cuda, capture worked)."""
        return bool(getattr(self._executor, "uses_graph", False))

    @property
    def graph_unavailable(self) -> Optional[str]:
        """Why a cuda artifact runs as plain stream launches (None otherwise)."""
        return getattr(self._executor, "graph_unavailable", None)

    @property
    def max_contexts(self) -> int:
        """How many pooled contexts (passes of `run`) may exist at once."""
        return self._executor.pool.limit

    def set_threads(self, n: int) -> None:
        """Intra-op threads of every pooled pass from now on (n <= 0: back to the even
        share of the cores among the passes in flight); no effect on a GPU."""
        self._executor.set_threads(n)

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One forward pass on a pooled context: safe from any thread."""
        return self._executor.run(inputs)

    def context(self, threads: Optional[int] = None) -> OwnContext:
        """An execution context of the caller's own -- its scratch (the arena; on cuda
        its stream, I/O buffers and CUDA graph), `threads` intra-op threads (None: the
        even share at each pass) -- for a server thread that wants control:
        `with model.context(threads=2) as ctx: ctx.run(feeds)`. One pass at a time."""
        return self._executor.context(threads)

    def profile(self, inputs: Mapping[str, np.ndarray], repeat: int = 10) -> list[dict]:
        """`profile_rows` of the executor's per-launch median milliseconds (see its
        `profile`); ArtifactError where the executor cannot time single launches."""
        profile = getattr(self._executor, "profile", None)
        if profile is None:
            raise ArtifactError(f"{self.path}: per-kernel profiling is not supported for "
                                f"the {self.target} target yet")
        times = profile(inputs, repeat)
        return profile_rows(self.manifest, times, self._executor.pass_of(inputs).variant)

    def run_with_hook(self, inputs: Mapping[str, np.ndarray], hook) -> dict[str, np.ndarray]:
        """One pass launch by launch with `hook` around each launch (the CPU executor's
        or the emulator's `run_with_hook`: what `kernel_check` drives); ArtifactError on
        a GPU."""
        run = getattr(self._executor, "run_with_hook", None)
        if run is None:
            raise ArtifactError(f"{self.path}: the per-kernel comparison runs on the cpu "
                                f"target or in the emulator: add --emulate")
        return run(inputs, hook)

    def close(self) -> None:
        """Free the pooled contexts (and on cuda the device memory); runs after it fail."""
        self._executor.close()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def load(out_dir: str | os.PathLike, *, verify_checksums: bool = True,
         emulate: bool = False, sanitize: bool = False,
         max_contexts: Optional[int] = None, runtime: str = "python") -> Model:
    """Load an artifact; `emulate=True` runs a cuda artifact on the CPU (slow; tests);
    `sanitize=True` (with emulate) checks every run for hazards and raises
    `SanitizerError` (`hidetc.backends.runtime.emulated`) naming them; `max_contexts`
    bounds the passes in flight at once (default: twice the cores on the cpu, a few
    streams on a GPU; `runtime.contexts`); `runtime="c"` executes the plan through the
    artifact's own C runtime (`libhidetc_runtime.so`, what services without Python
    link) instead of this package's executors: same outputs, bit for bit."""
    return Model(out_dir, verify_checksums=verify_checksums, emulate=emulate,
                 sanitize=sanitize, max_contexts=max_contexts, runtime=runtime)
