"""The PyTorch peers of the GPU check: one process times every (model, mode, precision)
it is given, so torch, torchvision and transformers are imported once.

    python bench/gpu_peers.py OUT.json --plan resnet50:eager+graph-cl:f16,bert_base:eager:f16
                              [--seconds S] [--repeat N]

Models: the same definitions as hidetc's benchmark models (torchvision ResNet-50,
Inception-V3 without the aux head, MobileNet-V2; transformers BertModel and GPT2Model at
sequence length 128; random weights, batch 1), built once on the CPU in f32, one GPU copy
per (precision, memory format) made on first use. Modes:
    eager           the module called from Python (host-bound at batch 1)
    eager+graph     eager captured once into a CUDA graph, the graph replayed
    eager+graph-cl  the same with channels_last tensors (cuDNN's fast f16 convolutions;
                    vision models only)
    compile         torch.compile(mode="reduce-overhead"): Inductor with CUDA graphs (its
                    first call compiles: tens of seconds)
f32 runs with TF32 off (hidetc's f32 must meet 1e-4); cudnn.benchmark is on. Timing:
WARMUP calls, then the median of `repeat` calls each between two CUDA events.

Items run in the plan's order; one that the time left cannot fit (MIN_SECONDS) is
recorded as skipped, one that fails records its error, and OUT.json is rewritten after
every item, so a timeout or a crash keeps what was measured. Without torch or a GPU
every item is recorded as skipped with the reason, and the exit status is still 0.
"""
from __future__ import annotations

import argparse
import copy
import importlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hidetc.tools.bench_torch import cuda_median_ms  # noqa: E402

VISION = ("resnet50", "inception_v3", "mobilenet_v2")
MIN_SECONDS = {"compile": 25.0}     # an item is started only with this much time left
WARMUP = 10


def torch_model(name: str, torch):
    """(module, positional inputs, keyword inputs): f32, random weights, batch 1, CPU."""
    if name in VISION:
        torchvision = importlib.import_module("torchvision")
        kwargs = {"aux_logits": False, "init_weights": False} if name == "inception_v3" else {}
        module = getattr(torchvision.models, name)(weights=None, **kwargs)
        size = 299 if name == "inception_v3" else 224
        return module, (torch.randn(1, 3, size, size),), {}
    transformers = importlib.import_module("transformers")
    if name == "bert_base":
        module = transformers.BertModel(transformers.BertConfig())
        ids = torch.randint(0, 30522, (1, 128))
        return module, (), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if name == "gpt2":
        module = transformers.GPT2Model(transformers.GPT2Config())
        return module, (), {"input_ids": torch.randint(0, 50257, (1, 128))}
    raise ValueError(f"no PyTorch definition for {name!r}")


def time_fn(fn, torch, repeat: int) -> float:
    """Median device ms of `fn()` between two CUDA events, after WARMUP calls."""
    return cuda_median_ms(fn, torch, repeat, warmup=WARMUP)


def graphed(fn, torch):
    """`fn` captured once into a CUDA graph (after warm-up on a side stream): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


class Peer:
    """One model built once (f32, CPU); per (precision, channels_last) a GPU copy."""

    def __init__(self, name: str, torch):
        self.name, self.torch = name, torch
        self.base, self.args, self.kwargs = torch_model(name, torch)
        self.base.eval()
        self.copies: dict[tuple, tuple] = {}

    def inputs(self, dtype: str, channels_last: bool):
        torch, key = self.torch, (dtype, channels_last)
        if key not in self.copies:
            half = dtype == "f16"
            module = copy.deepcopy(self.base).cuda()
            module = module.half() if half else module

            def prepare(t):
                t = (t.half() if half and t.is_floating_point() else t).cuda()
                return t.contiguous(memory_format=torch.channels_last) \
                    if channels_last and t.dim() == 4 else t
            if channels_last:
                module = module.to(memory_format=torch.channels_last)
            self.copies[key] = (module, tuple(prepare(t) for t in self.args),
                                {k: prepare(t) for k, t in self.kwargs.items()})
        return self.copies[key]

    def time(self, mode: str, dtype: str, repeat: int) -> float:
        module, args, kwargs = self.inputs(dtype, mode == "eager+graph-cl")
        torch = self.torch
        with torch.inference_mode():
            if mode == "eager":
                return time_fn(lambda: module(*args, **kwargs), torch, repeat)
            if mode in ("eager+graph", "eager+graph-cl"):
                return time_fn(graphed(lambda: module(*args, **kwargs), torch), torch, repeat)
            if mode == "compile":
                compiled = torch.compile(module, mode="reduce-overhead")
                return time_fn(lambda: compiled(*args, **kwargs), torch, repeat)
        raise ValueError(f"unknown mode {mode!r}")


def parse_plan(text: str) -> list[tuple[str, str, str]]:
    items = []
    for item in filter(None, text.split(",")):
        parts = item.split(":")
        if len(parts) != 3:
            raise SystemExit(f"gpu_peers: plan item {item!r} is not MODEL:MODE:PRECISION")
        items.append(tuple(parts))
    return items


def open_torch():
    """(torch, None) with TF32 off and cudnn.benchmark on, or (None, why not)."""
    try:
        torch = importlib.import_module("torch")
    except ImportError as exc:
        return None, f"torch is not installed ({exc})"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA GPU"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    return torch, None


def run(out: Path, plan: list[tuple[str, str, str]], seconds: float, repeat: int) -> dict:
    deadline = time.time() + seconds
    doc: dict = {"rows": {}, "repeat": repeat}
    torch, why = open_torch()
    if torch is not None:
        doc["torch"] = torch.__version__
    peers: dict[str, Peer] = {}
    for name, mode, dtype in plan:
        row: dict = {}
        if torch is None:
            row["skipped"] = why
        elif deadline - time.time() < MIN_SECONDS.get(mode, 3.0):
            row["skipped"] = "out of time"
        else:
            start = time.perf_counter()
            try:
                if name not in peers:
                    peers[name] = Peer(name, torch)
                row["median_ms"] = peers[name].time(mode, dtype, repeat)
            except Exception as exc:   # a peer that fails is a recorded fact, not a crash
                row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            row["seconds"] = round(time.perf_counter() - start, 1)
        doc["rows"].setdefault(name, {})[f"{mode} {dtype}"] = row
        out.write_text(json.dumps(doc, indent=1))
        print(f"{name} {mode} {dtype}: " + (f"{row['median_ms']:.3f} ms" if "median_ms" in row
                                           else row.get("skipped") or row.get("error")),
              flush=True)
    out.write_text(json.dumps(doc, indent=1))
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--plan", required=True)
    p.add_argument("--seconds", type=float, default=120.0)
    p.add_argument("--repeat", type=int, default=100)
    a = p.parse_args(argv)
    run(a.out, parse_plan(a.plan), a.seconds, a.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
