"""Time several artifacts of one model side by side with ONNX Runtime, in one process:
the A/B check for a kernel or tuning change on a machine whose speed drifts.

    python bench/ab_models.py MODEL.onnx OLD_ARTIFACT NEW_ARTIFACT [--rounds 10]

Every round runs each runner (each artifact, then ORT) after an idle pause
(`hidetc.tools.bench.BLOCK_PAUSE_S`), one untimed call, then `--calls` timed calls; printed
per runner: min, 25th percentile and median ms over all rounds, and the median (and
quartiles) over rounds of its ratio to ORT in the same round (each runner's best call
of the round). On the 2-core CI-like
machine the speed of the same binary drifted 30-40% over minutes, so only runners timed
in the same rounds compare; a change is real when its median moves beyond the spread
between rounds, and its ratio to ORT is the number to report.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import onnx

import hidetc
from hidetc.tools.bench import BLOCK_PAUSE_S

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402  (the repository's models package: sample inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="the .onnx file (inputs and the ORT runner)")
    parser.add_argument("artifacts", nargs="+", help="artifact directories to compare")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--calls", type=int, default=3, help="timed calls per round")
    parser.add_argument("--no-ort", action="store_true", help="artifacts only")
    args = parser.parse_args()
    inputs = models.sample_inputs(onnx.load(args.model, load_external_data=False), 0)
    runners = {}
    for path in args.artifacts:
        model = hidetc.load(path)
        runners[path] = lambda model=model: model.run(inputs)
    if not args.no_ort:
        import onnxruntime as ort
        session = ort.InferenceSession(args.model, providers=["CPUExecutionProvider"])
        runners["onnxruntime"] = lambda: session.run(None, inputs)
    times: dict[str, list[float]] = {name: [] for name in runners}
    best: dict[str, list[float]] = {name: [] for name in runners}   # per round: min
    for fn in runners.values():
        fn()
    for _ in range(args.rounds):
        for name, fn in runners.items():
            time.sleep(BLOCK_PAUSE_S)
            fn()
            for _ in range(args.calls):
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
            best[name].append(min(times[name][-args.calls:]))
    width = max(len(n) for n in runners)
    for name, values in times.items():
        line = (f"{name:<{width}}  min {np.min(values):9.3f}  p25 "
                f"{np.percentile(values, 25):9.3f}  median {np.median(values):9.3f} ms")
        if "onnxruntime" in best and name != "onnxruntime":
            ratios = np.array(best[name]) / np.array(best["onnxruntime"])
            line += (f"  x ORT per round: median {np.median(ratios):.3f} "
                     f"(q25 {np.percentile(ratios, 25):.3f}, q75 {np.percentile(ratios, 75):.3f})")
        print(line)


if __name__ == "__main__":
    main()
