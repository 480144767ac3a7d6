"""An artifact beside ONNX Runtime at three graph optimization levels, in one process:
how much of ORT's CPU latency comes from its NCHWc layout transformer (ALL has it,
EXTENDED has every fusion but keeps NCHW, BASIC only constant folding and the like).

    python bench/ort_layouts.py MODEL.onnx ARTIFACT [--rounds 10] [--threads 2]

Runners alternate round by round (an idle pause, one untimed call, then `--calls`
timed calls; a round's time is their minimum); printed per runner: the median over
rounds and the median of the per-round ratio to the artifact.
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort

import hidetc

LEVELS = {"ort_all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
          "ort_extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "ort_basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("artifact")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    model = hidetc.load(args.artifact)
    rng = np.random.default_rng(0)
    feed = {i["name"]: rng.standard_normal(i["shape"]).astype(i["dtype"])
            for i in model.manifest["inputs"]}
    runners = {"hidetc": lambda: model.run(feed)}
    for name, level in LEVELS.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.graph_optimization_level = level
        session = ort.InferenceSession(args.model, options,
                                       providers=["CPUExecutionProvider"])
        runners[name] = lambda s=session: s.run(None, feed)
    per: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for name, fn in runners.items():
            time.sleep(0.1)
            fn()
            times = []
            for _ in range(args.calls):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
            per[name].append(min(times) * 1e3)
    base = np.array(per["hidetc"])
    for name, values in per.items():
        v = np.array(values)
        print(f"{name:13s} median {np.median(v):8.2f} ms   ratio to hidetc "
              f"{np.median(v / base):.3f}")


if __name__ == "__main__":
    main()
