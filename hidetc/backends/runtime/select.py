"""Pick the executor for an artifact's target: the CPU executor (ctypes), the CUDA
executor (pycuda; needs a GPU), or the emulator for a CUDA artifact on the CPU."""
from __future__ import annotations

import functools
import importlib.util
import logging
import shutil
import subprocess
from pathlib import Path
from typing import Optional

from hidetc import cpu_isa
from hidetc.backends.runtime.c_executor import CRuntimeExecutor
from hidetc.backends.runtime.cuda.driver import session
from hidetc.backends.runtime.cuda.executor import CudaExecutor
from hidetc.backends.runtime.emulated import EmulatedCudaExecutor
from hidetc.backends.runtime.executor import CpuExecutor
from hidetc.errors import ArtifactError
from hidetc.target import usable_cores

RUNTIMES = ("python", "c")     # what executes the plan: this package, or the artifact's C

log = logging.getLogger("hidetc")


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """A CUDA GPU is visible (nvidia-smi lists one) and pycuda can be imported."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                timeout=20).stdout
        return "GPU" in listed and importlib.util.find_spec("pycuda") is not None
    except (OSError, subprocess.SubprocessError):
        return False


def gpu_limits() -> dict:
    """The visible GPU's facts for `hidetc.target.cuda_target(device=...)` (opens the
    process's CUDA session); ArtifactError when there is no usable GPU."""
    return session().limits()


@functools.lru_cache(maxsize=1)
def gpu_name() -> str:
    """The first GPU's name as nvidia-smi reports it ("none" when there is none): the
    device part of a tuning record's key."""
    if shutil.which("nvidia-smi") is None:
        return "none"
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return "none"
    names = [line.strip() for line in out.splitlines() if line.strip()]
    return names[0] if names else "none"


def _warn_other_cores(path: Path, manifest: dict) -> None:
    """A cpu artifact shaped for another core count runs correctly but not at its best:
    say so once per load (the ISA, which decides whether it runs at all, is checked
    above)."""
    cores = (manifest.get("machine") or {}).get("cores")
    here = usable_cores()
    if cores and cores != here:
        log.warning("%s: compiled for %d cores, this process has %d: the parallel loops "
                    "are shaped for the other machine (recompile here for full speed)",
                    path, cores, here)


def make_executor(path: Path, manifest: dict, *, emulate: bool = False,
                  warn_cores: bool = True, sanitize: bool = False,
                  max_contexts: Optional[int] = None, runtime: str = "python"):
    """The executor of the artifact at `path`; `warn_cores=False` (the compile's own
    verification of a cross-compiled artifact) skips the other-core-count warning;
    `max_contexts` bounds the pooled execution contexts (`runtime.contexts`; None: the
    executor's default); `runtime="c"` runs the plan through the artifact's own C
    runtime (`c_executor`; it checks the machine itself and says why in one line)."""
    target = manifest["target"]
    if runtime not in RUNTIMES:
        raise ArtifactError(f"runtime: expected one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if runtime == "c":
        if emulate or sanitize:
            raise ArtifactError(f"{path}: --emulate and --sanitize run the Python runtime's "
                                f"emulator, not the C runtime")
        return CRuntimeExecutor(path, manifest, max_contexts)
    if target == "cpu":
        if sanitize:
            raise ArtifactError(f"{path}: --sanitize applies to cuda artifacts run in the "
                                f"emulator; this one targets cpu")
        if emulate:
            raise ArtifactError(f"{path}: --emulate applies to cuda artifacts; this one "
                                f"targets cpu")
        isa = cpu_isa.ISAS.get(manifest.get("cpu_isa", ""))
        if isa is not None and not cpu_isa.runs_here(isa):
            raise ArtifactError(f"{path}: the artifact's kernels use {isa.name} "
                                f"({isa.host_flag}), which this CPU lacks: compile it here, "
                                f"or with {cpu_isa.ENV}=avx2")
        missing = cpu_isa.features_missing(manifest.get("cpu_features") or ())
        if missing:
            raise ArtifactError(f"{path}: the artifact's kernels use {', '.join(missing)}, "
                                f"which this CPU lacks: compile it here (or for this CPU "
                                f"with --precision f32)")
        if warn_cores:
            _warn_other_cores(path, manifest)
        return CpuExecutor(path, manifest, max_contexts)
    if target == "cuda":
        if sanitize and not emulate:
            raise ArtifactError(f"{path}: --sanitize runs in the emulator: add --emulate")
        return (EmulatedCudaExecutor(path, manifest, sanitize=sanitize,
                                     max_contexts=max_contexts) if emulate
                else CudaExecutor(path, manifest, max_contexts=max_contexts))
    raise ArtifactError(f"{path}: unknown target {target!r} in the manifest")
