"""Child-process entry that finds which kernel launch of a CUDA artifact fails.

    python -m hidetc.backends.runtime.cuda.locate ARTIFACT_DIR MANIFEST.json INPUTS.npz

Run by `CudaExecutor` after a failed graph replay: a kernel fault leaves the parent's
CUDA context unusable, so the search needs a fresh process. It builds the executor
without a graph and with a synchronize after every launch (and CUDA_LAUNCH_BLOCKING=1
from the parent), runs the given inputs, and prints one line
`hidetc-locate: <error naming the launch and kernel>` when something fails.
Exit status: 0 when everything ran, 3 when an error was printed.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from hidetc.backends.runtime.cuda.executor import LOCATE_PREFIX, CudaExecutor
from hidetc.errors import HidetcError


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    path, manifest_path, inputs_path = argv
    manifest = json.loads(Path(manifest_path).read_text())
    with np.load(inputs_path) as data:
        inputs = {name: data[name] for name in data.files}
    try:
        executor = CudaExecutor(Path(path), manifest, use_graph=False, sync_each=True)
        executor.run(inputs)
    except HidetcError as exc:
        print(f"{LOCATE_PREFIX}{exc}", flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
