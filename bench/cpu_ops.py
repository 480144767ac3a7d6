"""Time single MatMul and Conv shapes of the five benchmark models on the CPU: hidetc (a
one-node ONNX model compiled end to end with the templates' default configs, run
through `hidetc.load(...).run`) beside ONNX Runtime (the same model, CPU provider), in
the same process; prints ms and the ratio hidetc / ORT.

    python bench/cpu_ops.py [--filter TEXT] [--rounds 5] [--threads N] [--work DIR]
                            [--json FILE] [--big]

Timing: the two runners alternate in rounds (each round: a warm-up call, then batches
of calls for ~0.1 s); a runner's time is the minimum over its batches of the mean time
per call. Alternating and taking minima keeps a busy second core or the other runtime's
spinning worker threads from deciding the result; still repeat a run before trusting a
small difference. `--big` adds GPT-2's LM head (128 x 768 x 50257: a 154 MB weight).
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import hidetc


@dataclass
class Case:
    """One op instance: graph inputs (shapes), constant inputs (shapes), attributes."""
    name: str
    op: str
    inputs: dict[str, tuple]
    consts: dict[str, tuple] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)


def conv(name, c, oc, hw, k, stride=1, pad=None, group=1, bias=True) -> Case:
    kh, kw = (k, k) if isinstance(k, int) else k
    pads = pad if pad is not None else [kh // 2, kw // 2, kh // 2, kw // 2]
    consts = {"w": (oc, c // group, kh, kw)}
    if bias:
        consts["b"] = (oc,)
    return Case(name, "Conv", {"x": (1, c, hw, hw)}, consts,
                {"strides": [stride, stride], "pads": list(pads), "group": group})


def matmul(name, m, k, n, batch=(), const_b=True) -> Case:
    a, b = tuple(batch) + (m, k), tuple(batch) + (k, n)
    if const_b:
        return Case(name, "MatMul", {"a": a}, {"b": b})
    return Case(name, "MatMul", {"a": a, "b": b})


def pool(name, op, c, hw, k, stride, pad, **attrs) -> Case:
    return Case(name, op, {"x": (1, c, hw, hw)}, {},
                {"kernel_shape": [k, k], "strides": [stride, stride], "pads": [pad] * 4,
                 **attrs})


CASES = [
    matmul("matmul 1024^3", 1024, 1024, 1024),
    conv("resnet50 conv1 7x7 s2", 3, 64, 224, 7, stride=2),
    conv("resnet50 l1 1x1 64->64", 64, 64, 56, 1),
    conv("resnet50 l1 3x3 64", 64, 64, 56, 3),
    conv("resnet50 l1 1x1 64->256", 64, 256, 56, 1),
    conv("resnet50 l1 1x1 256->64", 256, 64, 56, 1),
    conv("resnet50 l2 3x3 128 s2", 128, 128, 56, 3, stride=2),
    conv("resnet50 l2 3x3 128", 128, 128, 28, 3),
    conv("resnet50 l2 1x1 512->128", 512, 128, 28, 1),
    conv("resnet50 l3 1x1 512->1024 s2", 512, 1024, 28, 1, stride=2),
    conv("resnet50 l3 3x3 256", 256, 256, 14, 3),
    conv("resnet50 l3 1x1 1024->256", 1024, 256, 14, 1),
    conv("resnet50 l4 3x3 512", 512, 512, 7, 3),
    conv("resnet50 l4 1x1 2048->512", 2048, 512, 7, 1),
    conv("resnet50 l4 1x1 1024->2048 s2", 1024, 2048, 14, 1, stride=2),
    matmul("resnet50 fc", 1, 2048, 1000),
    conv("mobilenet_v2 conv 3x3 s2", 3, 32, 224, 3, stride=2),
    conv("mobilenet_v2 dw 3x3 32", 32, 32, 112, 3, group=32),
    conv("mobilenet_v2 1x1 16->96", 16, 96, 112, 1),
    conv("mobilenet_v2 dw 3x3 96 s2", 96, 96, 112, 3, stride=2, group=96),
    conv("mobilenet_v2 dw 3x3 144", 144, 144, 56, 3, group=144),
    conv("mobilenet_v2 1x1 144->24", 144, 24, 56, 1),
    conv("mobilenet_v2 dw 3x3 960 @7", 960, 960, 7, 3, group=960),
    conv("mobilenet_v2 1x1 320->1280", 320, 1280, 7, 1),
    conv("inception_v3 1x7 128", 128, 128, 17, (1, 7)),
    conv("inception_v3 7x1 128->192", 128, 192, 17, (7, 1)),
    conv("inception_v3 3x3 s2 288->384", 288, 384, 35, 3, stride=2, pad=[0, 0, 0, 0]),
    matmul("bert qkv/proj 128x768x768", 128, 768, 768, batch=(1,)),
    matmul("bert ffn1 128x768x3072", 128, 768, 3072, batch=(1,)),
    matmul("bert ffn2 128x3072x768", 128, 3072, 768, batch=(1,)),
    matmul("bert attn QK^T 12x128x64x128", 128, 64, 128, batch=(1, 12), const_b=False),
    matmul("bert attn PV 12x128x128x64", 128, 128, 64, batch=(1, 12), const_b=False),
    matmul("gpt2 c_attn 128x768x2304", 128, 768, 2304, batch=(1,)),
    pool("resnet50 maxpool 3x3 s2", "MaxPool", 64, 112, 3, 2, 1),
    pool("inception_v3 maxpool 3x3 s2 288", "MaxPool", 288, 35, 3, 2, 0),
    pool("inception_v3 avgpool 3x3 192", "AveragePool", 192, 35, 3, 1, 1, count_include_pad=1),
    Case("bert softmax 12x128x128", "Softmax", {"x": (1, 12, 128, 128)}, {}, {"axis": -1}),
]
BIG = [matmul("gpt2 lm_head 128x768x50257", 128, 768, 50257, batch=(1,))]


def onnx_model(case: Case, arrays: dict[str, np.ndarray]) -> onnx.ModelProto:
    names = list(case.inputs) + list(case.consts)
    node = helper.make_node(case.op, names, ["y"], **case.attrs)
    graph = helper.make_graph(
        [node], case.op.lower(),
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, s) for k, s in case.inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(arrays[k], k) for k in case.consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def flops(case: Case, out_shape: tuple) -> float:
    """Multiply-adds x 2 of a MatMul or Conv; 0 for the other ops (not compute-bound)."""
    if case.op not in ("MatMul", "Conv"):
        return 0.0
    if case.op == "MatMul":
        return 2.0 * np.prod(out_shape) * case.inputs["a"][-1]
    _, cg, kh, kw = case.consts["w"]
    return 2.0 * np.prod(out_shape) * cg * kh * kw


def interleaved(fns, rounds: int, budget_s: float = 0.1, chunk: int = 3) -> list[float]:
    """Per fn: the minimum over its batches of the mean ms per call (module docstring)."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            fn()
            end = time.perf_counter() + budget_s
            while time.perf_counter() < end:
                start = time.perf_counter()
                for _ in range(chunk):
                    fn()
                best[i] = min(best[i], (time.perf_counter() - start) / chunk * 1e3)
    return best


def prepare(case: Case, work: Path, threads: int | None):
    """(hidetc runner, ORT runner, output shape) for one case."""
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    arrays = {k: rng.standard_normal(s).astype(np.float32)
              for k, s in {**case.inputs, **case.consts}.items()}
    proto = onnx_model(case, arrays)
    slug = "".join(ch if ch.isalnum() else "_" for ch in case.name)
    path = work / f"{slug}.onnx"
    onnx.save(proto, path)
    out_dir = work / f"{slug}.out"
    shutil.rmtree(out_dir, ignore_errors=True)  # gcc's build cache keeps recompiles quick
    hidetc.compile_model(path, out_dir, target="cpu", verify=False)
    model = hidetc.load(out_dir)
    options = ort.SessionOptions()
    if threads:
        model.set_threads(threads)
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(proto.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feeds = {k: arrays[k] for k in case.inputs}
    ours, theirs = model.run(feeds)["y"], session.run(None, feeds)[0]
    err = float(np.linalg.norm(ours - theirs) / max(np.linalg.norm(theirs), 1e-30))
    if err > 1e-4:
        raise AssertionError(f"{case.name}: hidetc differs from ORT (rel err {err:.2e})")
    return (lambda: model.run(feeds)), (lambda: session.run(None, feeds)), theirs.shape


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--work", default="/tmp/hidetc-bench-ops")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--big", action="store_true", help="add GPT-2's LM head")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'case':<36}{'hidetc ms':>10}{'ORT ms':>9}{'ratio':>7}{'GFLOP/s':>9}")
    for case in CASES + (BIG if args.big else []):
        if args.filter not in case.name:
            continue
        ours, theirs, out_shape = prepare(case, work, args.threads)
        t_ours, t_ort = interleaved([ours, theirs], args.rounds)
        gflops = flops(case, out_shape) / t_ours / 1e6
        rows.append({"case": case.name, "hidetc_ms": t_ours, "onnxruntime_ms": t_ort,
                     "ratio": t_ours / t_ort, "hidetc_gflops": gflops or None})
        rate = f"{gflops:>9.1f}" if gflops else f"{'-':>9}"
        print(f"{case.name:<36}{t_ours:>10.3f}{t_ort:>9.3f}{t_ours / t_ort:>7.2f}{rate}",
              flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
