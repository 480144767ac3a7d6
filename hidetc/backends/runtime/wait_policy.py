"""How the cpu kernels' OpenMP threads wait for work: spin briefly, then sleep.

The cpu kernels are built by gcc with OpenMP, so their threads are libgomp's. Between
parallel regions (the kernels of a pass) and between passes, an idle libgomp thread
spins before it sleeps; libgomp's default spin (GOMP_SPINCOUNT 300,000 iterations of a
pause loop: milliseconds) keeps the cores busy long after a pass when nothing else wants
them, and steals them when something does -- another process, or the other passes in
flight. Measured beside ONNX Runtime (`bench/concurrency.py contention` and `quiet`;
bench/results/2026-12-07-concurrency.md): under a competing load the default's latency
ratio to ORT grew most, a short spin or the passive policy kept it; on a quiet machine a
short spin kept the default's latency where the passive policy (sleep at once) slowed
models of many small kernels; binding the threads to cores (OMP_PROC_BIND=close) made
it worse. So the policy is SPIN_COUNT spins (a few to a hundred microseconds by the
CPU's pause latency: longer than the gap between two kernels of a pass, far shorter
than a time slice) and no binding.

libgomp reads its settings once, when it starts in a process (the first library that
needs it is loaded), so `apply()` sets them in the environment before the executor
loads the first kernel library, and the tuner passes them to its workers (candidates are
measured as they will run). A user's own OMP_WAIT_POLICY or GOMP_SPINCOUNT is kept; a
process where libgomp already runs (loaded by another library first) keeps the settings
it started with.
"""
from __future__ import annotations

import ctypes
import os
from typing import Mapping, MutableMapping

# chosen from measurements on one 2-core machine (bench/results/2026-12-07-concurrency.md),
# not checked on bigger ones
SPIN_COUNT = 3000
USER_SETTINGS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
LIBGOMP = "libgomp.so.1"


def settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to `environ` for a libgomp about to start there: none where
    the user set a wait policy or spin count themselves."""
    if any(key in environ for key in USER_SETTINGS):
        return {}
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT)}


def libgomp_started() -> bool:
    """Whether libgomp is already loaded in this process (then its settings are fixed)."""
    try:
        ctypes.CDLL(LIBGOMP, mode=getattr(os, "RTLD_NOLOAD", 4) | ctypes.RTLD_LOCAL)
    except OSError:
        return False
    return True


def apply(environ: MutableMapping[str, str] = os.environ) -> str:
    """Set the policy for this process's libgomp if it has not started; says what
    holds: "hidetc" (set now or before), "user" or "started" (another library's)."""
    extra = settings(environ)
    if not extra:
        return "hidetc" if environ.get("GOMP_SPINCOUNT") == str(SPIN_COUNT) else "user"
    if libgomp_started():
        return "started"
    environ.update(extra)
    return "hidetc"
