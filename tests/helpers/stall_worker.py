"""A stand-in measuring worker for tests of the parent side (`hidetc.driver.tune.common`):
`python -m helpers.stall_worker JOB START [BEST_MS]` speaks the worker protocol
(`hidetc.driver.tune.worker.serve`) without running kernels. A candidate is (time_ms, how):
how "stalled" reports 8 ms in the first pass (the job's full `repeat`) and its own time
after; "flaky" reports a wrong result in the second pass; "plain" its time always;
"blas" its time times the worker's OPENBLAS_NUM_THREADS (unset: 100)."""
from __future__ import annotations

import os
import sys

from hidetc.driver.tune.worker import serve

FULL_REPEAT = 20


class StallMeasurer:
    def __init__(self, job: dict, best_ms: float | None):
        self.job = job          # `serve` halves its "repeat" for the second pass

    def measure(self, time_ms: float, how: str):
        first_pass = self.job["repeat"] == FULL_REPEAT
        if how == "stalled" and first_pass:
            return 8.0, 8.0, None
        if how == "flaky" and not first_pass:
            return None, None, "wrong result: output 0: rel err 0.5"
        if how == "blas":
            time_ms *= int(os.environ.get("OPENBLAS_NUM_THREADS", "100"))
        return time_ms, time_ms, None


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1:], StallMeasurer, (OSError,)))
