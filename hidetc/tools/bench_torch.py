"""PyTorch peers for `hidetc bench --vs torch`: the same architectures in PyTorch
(torchvision for the CNNs, transformers for BERT-base and GPT-2, random weights, batch
1), timed as eager, eager replayed from a CUDA graph (cuda only) and torch.compile
(mode "reduce-overhead"), in the benchmark's precision (f32 with TF32 off, or f16).

Only the five benchmark models have PyTorch definitions here; other subjects get no
torch peers. torch, torchvision and transformers are optional: when missing,
`torch_peers` raises InputError naming what to install. Timing: CUDA events on the GPU
(median of `repeat` after warm-up), perf_counter on the CPU.
"""
from __future__ import annotations

import time
from typing import Callable

import numpy as np

from hidetc.errors import InputError

TORCHVISION = {"resnet50": "resnet50", "inception_v3": "inception_v3",
               "mobilenet_v2": "mobilenet_v2"}


def _import():
    try:
        import torch
    except ImportError:
        raise InputError("--vs torch needs PyTorch (pip install torch torchvision "
                         "transformers)") from None
    return torch


def _module(name: str, torch):
    if name in TORCHVISION:
        import torchvision
        kwargs = {"aux_logits": False, "init_weights": False} if name == "inception_v3" else {}
        return getattr(torchvision.models, TORCHVISION[name])(weights=None, **kwargs)
    if name == "bert_base":
        from transformers import BertConfig, BertModel
        return BertModel(BertConfig())
    if name == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel
        return GPT2LMHeadModel(GPT2Config())
    return None


def cuda_median_ms(fn: Callable[[], object], torch, repeat: int, warmup: int = 3) -> float:
    """Median device ms of `fn()` between two CUDA events, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return float(np.median(times))


def _timer(torch, device: str, repeat: int) -> Callable[[Callable[[], object]], float]:
    def timed(fn: Callable[[], object]) -> float:
        with torch.no_grad():
            if device == "cuda":
                return cuda_median_ms(fn, torch, repeat)
            for _ in range(3):
                fn()
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t) * 1e3)
            return float(np.median(times))
    return timed


def torch_peers(name: str, target: str, precision: str, inputs: dict, repeat: int
                ) -> dict[str, float]:
    """{"torch_eager": ms, "torch_cudagraph": ms, "torch_compile": ms} for model `name`
    (an empty dict for subjects without a PyTorch definition)."""
    torch = _import()
    module = _module(name, torch)
    if module is None:
        return {}
    device = "cuda" if target == "cuda" else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = torch.float16 if precision == "f16" else torch.float32
    module = module.eval().to(device=device, dtype=dtype)
    feeds = {k: torch.from_numpy(np.asarray(v)).to(device) for k, v in inputs.items()}
    feeds = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in feeds.items()}
    args = list(feeds.values())
    timed = _timer(torch, device, repeat)
    results = {"torch_eager": timed(lambda: module(*args))}
    if device == "cuda":
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad():
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    module(*args)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                module(*args)
        results["torch_cudagraph"] = timed(graph.replay)
    compiled = torch.compile(module, mode="reduce-overhead")
    results["torch_compile"] = timed(lambda: compiled(*args))
    return results
