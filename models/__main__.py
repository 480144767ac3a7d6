"""CLI for the benchmark-model builders.

    python -m models NAME -o PATH [--tiny] [--seed N] [--external-data] [--fold-bn]
    python -m models --list
    python -m models --sample MODEL.onnx -o INPUTS.npz [--seed N]

``--sample`` writes ``sample_inputs(model, seed)`` of an existing model file as .npz.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from . import REGISTRY, build, input_specs, sample_inputs, save


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m models", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="model name (see --list)")
    p.add_argument("-o", "--output", help="output .onnx path")
    p.add_argument("--tiny", action="store_true", help="small variant with the same op patterns")
    p.add_argument("--seed", type=int, default=0, help="weight seed (default 0)")
    p.add_argument("--external-data", action="store_true",
                   help="store weights in a side file <stem>.data")
    p.add_argument("--fold-bn", action="store_true",
                   help="CNNs: fold BatchNormalization into the convs (default: keep BN nodes)")
    p.add_argument("--list", action="store_true", help="list the available models")
    p.add_argument("--sample", metavar="MODEL", help="write sample inputs for MODEL (.onnx) "
                   "to the -o path as .npz instead of building a model")
    args = p.parse_args(argv)
    if args.sample is not None:
        if args.output is None or args.name is not None:
            p.error("--sample MODEL needs -o/--output and no NAME")
    elif not args.list and (args.name is None or args.output is None):
        p.error("NAME and -o/--output are required (or use --list or --sample)")
    if args.name is not None and args.name not in REGISTRY:
        p.error(f"unknown model {args.name!r}; choose from {', '.join(REGISTRY)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.list:
        print("\n".join(REGISTRY))
        return 0
    if args.sample is not None:
        return _write_samples(args.sample, args.output, args.seed)
    options = {"fold_bn": True} if args.fold_bn else {}
    if options and args.name not in ("resnet50", "inception_v3", "mobilenet_v2"):
        print(f"error: --fold-bn does not apply to {args.name}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    model = build(args.name, tiny=args.tiny, seed=args.seed, **options)
    t1 = time.perf_counter()
    save(model, args.output, external_data=args.external_data)
    t2 = time.perf_counter()
    out = Path(args.output)
    size = out.stat().st_size
    data = out.parent / (out.stem + ".data")
    if args.external_data and data.exists():
        size += data.stat().st_size
    n_params = sum(math.prod(t.dims) for t in model.graph.initializer)
    specs = ", ".join(f"{k}:{v[0]}{list(v[1])}" for k, v in input_specs(model).items())
    print(f"{args.name}{' (tiny)' if args.tiny else ''}: {len(model.graph.node)} nodes, "
          f"{n_params:,} weights, {size / 2**20:.1f} MiB -> {out}  "
          f"[build {t1 - t0:.1f}s, save {t2 - t1:.1f}s]  inputs: {specs}")
    return 0


def _write_samples(model_path: str, out_path: str, seed: int) -> int:
    """Only graph inputs, metadata and initializer dims are needed: skip external data."""
    model = onnx.load(model_path, load_external_data=False)
    feeds = sample_inputs(model, seed=seed)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "wb") as f:  # a file object keeps the exact name (no ".npz" appended)
        np.savez(f, **feeds)
    desc = ", ".join(f"{k}:{v.dtype}{list(v.shape)}" for k, v in feeds.items())
    print(f"sample inputs ({desc}) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
