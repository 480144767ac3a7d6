"""One artifact for a range of sizes against a static artifact per size and ONNX Runtime,
side by side in one process (issue 36's targets).

    python bench/dynamic_shapes.py [--model bert|resnet50] [--tiny] [--range 1..512]
                                   [--lengths 16,64,128,384] [--work DIR] [--out RESULT.json]
                                   [--no-tune] [--opts 16,128,384]

Builds the model with its dynamic axis as torch.onnx exports it (BERT: the sequence
"seq", `models.bert.build_bert_base(dynamic=True)`; ResNet-50: the batch "batch",
`models.resnet.build_resnet50(dynamic=True)`), compiles it once for the whole range
(`--dim NAME=LO..HI`) and once per size as a static artifact (`--dim NAME=N`: today's
static compile), then per size times the dynamic artifact, the static one and ONNX
Runtime interleaved round by round (`hidetc.tools.bench.alternate`), checks both
artifacts against ONNX Runtime's output, and prints (and writes) per size the medians
and the paired ratios dynamic/static and dynamic/ORT, plus both compile times. Both
artifacts are compiled with the same tuning setting (`--no-tune`: records, else the
defaults; the dynamic compile plans each variant's at its hint sizes).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

import hidetc
from hidetc.tools.bench import alternate, paired_ratio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from models import bert, resnet  # noqa: E402  (the repository's model builders)


def _bert(tiny: bool):
    def feeds(rng, n):
        return {"input_ids": rng.integers(0, 100, (1, n)).astype(np.int64),
                "attention_mask": np.ones((1, n), np.int64)}
    return bert.build_bert_base(tiny=tiny, dynamic=True), "seq", feeds


def _resnet50(tiny: bool):
    image = 32 if tiny else 224
    def feeds(rng, n):
        return {"input": rng.standard_normal((n, 3, image, image)).astype(np.float32)}
    return resnet.build_resnet50(tiny=tiny, dynamic=True), "batch", feeds


MODELS = {"bert": _bert, "resnet50": _resnet50}


def _compile(model: Path, out: Path, dim: str, size: str, tune: bool, opts=None) -> float:
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    hidetc.compile_model(model, out, target="cpu", dims={dim: size}, tune=tune,
                         dim_opts={dim: opts} if opts else None)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(MODELS), default="bert")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--range", default="1..512")
    p.add_argument("--lengths", default="16,64,128,384")
    p.add_argument("--work", default="bench-work/dynamic")
    p.add_argument("--out", default=None)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--no-tune", action="store_true")
    p.add_argument("--opts", default=None, help="the range's tuning sizes (--dim-opt); "
                   "default: hidetc's")
    args = p.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    proto, dim, make_feeds = MODELS[args.model](args.tiny)
    model = work / f"{args.model}_dynamic.onnx"
    onnx.save(proto, model)
    tune = not args.no_tune
    rows = {"model": args.model + ("_tiny" if args.tiny else ""), "dim": dim,
            "range": args.range, "tune": tune, "lengths": []}
    opts = [int(x) for x in args.opts.split(",")] if args.opts else None
    rows["opts"] = opts
    rows["dynamic_compile_s"] = _compile(model, work / "dynamic", dim, args.range, tune, opts)
    print(f"dynamic artifact ({dim} {args.range}): {rows['dynamic_compile_s']:.1f} s",
          flush=True)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    output = session.get_outputs()[0].name
    with hidetc.load(work / "dynamic") as dynamic:
        for length in (int(x) for x in args.lengths.split(",")):
            static_dir = work / f"static-{length}"
            static_s = _compile(model, static_dir, dim, str(length), tune)
            feeds = make_feeds(np.random.default_rng(length), length)
            with hidetc.load(static_dir) as static:
                ref = session.run(None, feeds)[0]
                errors = {}
                for name, m in (("dynamic", dynamic), ("static", static)):
                    got = m.run(feeds)[output]
                    errors[name] = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
                timed = alternate({"dynamic": lambda: dynamic.run(feeds),
                                   "static": lambda: static.run(feeds),
                                   "onnxruntime": lambda: session.run(None, feeds)},
                                  args.repeat, args.rounds)
            row = {"size": length, "static_compile_s": static_s, "rel_error": errors,
                   **{f"{k}_median_ms": v["median_ms"] for k, v in timed.items()},
                   "dynamic_over_static": paired_ratio(timed["dynamic"]["round_best_ms"],
                                                       timed["static"]["round_best_ms"]),
                   "dynamic_over_ort": paired_ratio(timed["dynamic"]["round_best_ms"],
                                                    timed["onnxruntime"]["round_best_ms"])}
            rows["lengths"].append(row)
            print(f"{dim} {length:4d}: dynamic {row['dynamic_median_ms']:8.2f} ms, static "
                  f"{row['static_median_ms']:8.2f} ms, ORT {row['onnxruntime_median_ms']:8.2f}"
                  f" ms; dynamic/static {row['dynamic_over_static']:.3f}, dynamic/ORT "
                  f"{row['dynamic_over_ort']:.3f}; static compile {static_s:.1f} s; errors "
                  f"{errors['dynamic']:.1e} / {errors['static']:.1e}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
