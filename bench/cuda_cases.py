"""The benchmark cases of bench/cuda_ops.py: one (template, task) per case, its inputs
and numpy reference, its PyTorch peer, the issue's target, and building its kernels.

Cases (`all_cases()`), in this order:
- matmul f16 on tensor cores (`matmul_tc`): 4096^3 (target: >= 80% of cuBLAS's
  throughput, i.e. time ratio <= 1.25), 1024^3 and the BERT-base projections
  (M x N x K = 128x768x768, 128x3072x768, 128x768x3072; target: ratio <= 1.1);
- matmul f32 on the SIMT core (`matmul_simt`): 4096^3 (target: >= 70% of cuBLAS with
  TF32 off, ratio <= 1/0.7), 1024^3 and the BERT shapes (no target: context);
- conv f16: every distinct ResNet-50 convolution (batch 1, the layer list generated
  from models/resnet.py's configuration, with the bias BatchNorm folding gives it), as
  hidetc runs it under --precision f16: ConvNHWC on tensor cores (`conv_tc`, OHWI
  weights) when C/G is a multiple of 8 (choose_layout's rule), else NCHW Conv with f16
  storage on the SIMT core (`conv_gemm`: the 3-channel stem); peer: torch conv2d in f16
  with channels_last tensors (cuDNN); target: ratio <= 1.25;
- conv f32: the same layers, NCHW Conv on the SIMT core (`conv_gemm`); peer: torch
  conv2d in f32 with TF32 off; target: ratio <= 1.25.
The ratio is hidetc's time / the peer's time: below 1 hidetc is faster.

Inputs are seeded standard normals (weights scaled by 1/sqrt(fan-in) so outputs stay
O(1)), rounded to the storage dtype first; the reference is numpy in float32 on those
rounded values (`Case.canonical`: NCHW / OIHW), moved into the kernel's layout by
`Case.kernel_layout`. The peer gets the same values.
"""
from __future__ import annotations

import importlib
import math
import os
import random
import zlib
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hidetc.backends.codegen.cuda import (
    CUDA_INCLUDE_DIR,
    dynamic_shared_bytes,
    print_cuda_module,
)
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources
from hidetc.compute.task import Task
from hidetc.graph.ir import TensorType
from hidetc.graph.passes.choose_layout import CHANNEL_CHUNK
from hidetc.schedules.cuda import conv_gemm, conv_tc, matmul_simt, matmul_tc
from hidetc.target import cuda_target
from hidetc.tir import scratch
from hidetc.tir.ir import Buffer
from hidetc.tir.pipeline import lower

DTYPES = {"f16": "float16", "f32": "float32"}
NUMPY = {"f16": np.float16, "f32": np.float32}
TOLERANCE = {"f16": 1e-2, "f32": 1e-4}
CUDA = cuda_target()      # sm_90's limits (the H200's): the GPU the cases are set for
SPIN = "hidetc_bench_spin"
SPIN_SOURCE = f"""extern "C" __global__ void {SPIN}(unsigned long long ns) {{
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {{ asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); }} while (t - t0 < ns);
}}
"""


@dataclass(frozen=True)
class Case:
    group: str             # "matmul" | "conv"
    name: str
    op: str                # "MatMul" | "Conv" (NCHW) | "ConvNHWC"
    precision: str         # "f16" | "f32"
    dims: tuple            # MatMul: (m, n, k); Conv: (c, oc, hw, kernel, stride, pad)
    bound: float | None    # target: hidetc time / peer time <= bound
    target: str = ""

    @property
    def template(self) -> Any:
        if self.op == "MatMul":
            return matmul_tc.TEMPLATE if self.precision == "f16" else matmul_simt.TEMPLATE
        return conv_tc.TEMPLATE if self.op == "ConvNHWC" else conv_gemm.TEMPLATE

    @property
    def slug(self) -> str:
        return "".join(ch if ch.isalnum() else "_" for ch in f"{self.precision}_{self.name}")

    @property
    def out_hw(self) -> int:
        c, oc, hw, k, s, p = self.dims
        return (hw + 2 * p - k) // s + 1

    @property
    def flops(self) -> float:
        if self.op == "MatMul":
            m, n, k = self.dims
            return 2.0 * m * n * k
        c, oc, hw, k, s, p = self.dims
        return 2.0 * oc * self.out_hw ** 2 * c * k * k

    def task(self) -> Task:
        dt = DTYPES[self.precision]
        if self.op == "MatMul":
            m, n, k = self.dims
            return Task("MatMul", (TensorType(dt, (m, k)), TensorType(dt, (k, n))),
                        (TensorType(dt, (m, n)),), (), (None, None))
        c, oc, hw, k, s, p = self.dims
        o = self.out_hw
        shapes = [(1, c, hw, hw), (oc, c, k, k), (oc,), (1, oc, o, o)]
        if self.op == "ConvNHWC":
            shapes = [(1, hw, hw, c), (oc, k, k, c), (oc,), (1, o, o, oc)]
        attrs = (("dilations", (1, 1)), ("group", 1), ("pads", (p, p, p, p)),
                 ("strides", (s, s)))
        ins = tuple(TensorType(dt, shape) for shape in shapes[:3])
        return Task(self.op, ins, (TensorType(dt, shapes[3]),), attrs, (None,) * 3)

    def kernel_layout(self, ins: list[np.ndarray], ref: np.ndarray
                      ) -> tuple[list[np.ndarray], np.ndarray]:
        """`canonical()`'s arrays in the kernel's layout: ConvNHWC takes NHWC x and OHWI
        w and writes NHWC; the others take them as they are."""
        if self.op != "ConvNHWC":
            return ins, ref
        return ([np.ascontiguousarray(ins[0].transpose(0, 2, 3, 1)),
                 np.ascontiguousarray(ins[1].transpose(0, 2, 3, 1)), ins[2]],
                np.ascontiguousarray(ref.transpose(0, 2, 3, 1)))

    def canonical(self) -> tuple[list[np.ndarray], np.ndarray]:
        """Seeded inputs rounded to the storage dtype (MatMul: a, b; Conv: x NCHW,
        w OIHW, bias) and the float32 reference computed from them."""
        rng = np.random.default_rng(zlib.crc32(self.slug.encode()))
        dt = NUMPY[self.precision]

        def normal(shape, scale=1.0):
            return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dt)
        if self.op == "MatMul":
            m, n, k = self.dims
            a, b = normal((m, k)), normal((k, n), 1 / math.sqrt(k))
            return [a, b], a.astype(np.float32) @ b.astype(np.float32)
        c, oc, hw, k, s, p = self.dims
        x, w, bias = normal((1, c, hw, hw)), normal((oc, c, k, k), 1 / math.sqrt(c * k * k)), \
            normal((oc,), 0.1)
        return [x, w, bias], conv_reference(x, w, bias, s, p)


def conv_reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray, stride: int,
                   pad: int) -> np.ndarray:
    """NCHW conv (batch 1, group 1) in float32: im2col windows . weights + bias."""
    xp = np.pad(x[0].astype(np.float32), ((0, 0), (pad, pad), (pad, pad)))
    k = w.shape[2]
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(1, 2))
    win = win[:, ::stride, ::stride]                       # C, OH, OW, KH, KW
    out = np.tensordot(w.astype(np.float32), win, axes=([1, 2, 3], [0, 3, 4]))
    return (out + bias.astype(np.float32)[:, None, None])[None]


def resnet50_convs() -> list[tuple[str, tuple]]:
    """The distinct ResNet-50 convolutions (batch 1) in network order: (name, (c, oc,
    hw, kernel, stride, pad)), generated from models/resnet.py's configuration."""
    from models.resnet import EXPANSION, FULL
    stem = FULL["stem"]
    layers = [("conv1 7x7 s2", (3, stem, FULL["image"], 7, 2, 3))]
    hw, cin = FULL["image"] // 4, stem          # conv1 stride 2, maxpool stride 2
    for i, (width, blocks) in enumerate(zip(FULL["widths"], FULL["blocks"])):
        for j in range(blocks):
            stride, cout = (2 if j == 0 and i > 0 else 1), width * EXPANSION
            tag = f"l{i + 1}"
            layers += [(f"{tag} 1x1 {cin}->{width} @{hw}", (cin, width, hw, 1, 1, 0)),
                       (f"{tag} 3x3 {width}{' s2' if stride > 1 else ''} @{hw}",
                        (width, width, hw, 3, stride, 1)),
                       (f"{tag} 1x1 {width}->{cout} @{hw // stride}",
                        (width, cout, hw // stride, 1, 1, 0))]
            if stride != 1 or cin != cout:
                layers.append((f"{tag} 1x1 {cin}->{cout}{' s2' if stride > 1 else ''} "
                               f"@{hw} (downsample)", (cin, cout, hw, 1, stride, 0)))
            hw, cin = hw // stride, cout
    seen, distinct = set(), []
    for name, dims in layers:
        if dims not in seen:
            seen.add(dims)
            distinct.append((name, dims))
    return distinct


MATMULS = [("4096^3", (4096, 4096, 4096)), ("1024^3", (1024, 1024, 1024)),
           ("bert qkv/proj 128x768x768", (128, 768, 768)),
           ("bert ffn1 128x3072x768", (128, 3072, 768)),
           ("bert ffn2 128x768x3072", (128, 768, 3072))]


def all_cases() -> list[Case]:
    cases = []
    for precision, template in (("f16", "tensor cores"), ("f32", "SIMT")):
        for name, dims in MATMULS:
            bound, target = None, ""
            if precision == "f16":
                bound, target = (1.25, ">= 80% of cuBLAS TFLOP/s") if dims[0] == 4096 else \
                    (1.1, "<= 1.1x cuBLAS time")
            elif dims[0] == 4096:
                bound, target = 1 / 0.7, ">= 70% of cuBLAS TFLOP/s (TF32 off)"
            cases.append(Case("matmul", f"matmul {name} ({template})", "MatMul", precision,
                              dims, bound, target))
    for precision in ("f16", "f32"):
        for name, dims in resnet50_convs():
            nhwc = precision == "f16" and dims[0] % CHANNEL_CHUNK == 0
            cases.append(Case("conv", f"resnet50 {name}", "ConvNHWC" if nhwc else "Conv",
                              precision, dims, 1.25, "<= 1.25x cuDNN time"))
    return cases


def select_configs(case: Case, limit: int) -> list:
    """The default first, then `limit` configs of a seeded shuffle of the rest."""
    task, template = case.task(), case.template
    default = template.default(task, CUDA)
    space = [c for c in template.space(task, CUDA) if c != default]
    chosen = random.Random(zlib.crc32(case.slug.encode())).sample(space, min(limit, len(space)))
    return [default] + chosen


# ---------------------------------------------------------------- building
@dataclass
class Kernel:
    """One built kernel: its case, config, launch shape and parameter sizes."""
    case: int              # index into the case list
    name: str
    config: dict
    grid: tuple
    block: tuple
    params: list           # (dtype, size) per buffer parameter of the task, in ABI order
    cubin: Path | None = None
    error: str | None = None     # why it could not be built (then it is not run)
    scratch: list = field(default_factory=list)   # (shape, dtype) per scratch buffer,
    #                            passed zeroed after the task's (`hidetc.tir.scratch`)
    shared: int = 0              # dynamic shared bytes a launch passes

    def ptxas(self) -> dict:
        return ptxas_resources(self.cubin).get(self.name, {}) if self.cubin else {}


def _lower(job: tuple) -> tuple[Kernel, str | None]:
    """(kernel, CUDA C); a build or lowering failure is the kernel's `error`."""
    index, case, cfg, name = job
    config = asdict(cfg) if is_dataclass(cfg) else {"config": repr(cfg)}
    try:
        fn = lower(case.template.build(case.task(), cfg, name, CUDA))
        own = scratch.task_params(fn)
        params = [(p.dtype, int(np.prod(p.shape))) for p in own if isinstance(p, Buffer)]
        if len(params) != len(own):
            raise ValueError("scalar kernel parameters are not supported here")
    except Exception as exc:
        return Kernel(index, name, config, (), (), [],
                      error=f"build: {type(exc).__name__}: {exc}"[:400]), None
    kernel = Kernel(index, name, config, tuple(fn.attr("grid")), tuple(fn.attr("block")),
                    params, scratch=[(tuple(b.shape), b.dtype)
                                     for b, _ in scratch.scratch_params(fn)],
                    shared=dynamic_shared_bytes(fn))
    return kernel, print_cuda_module([fn])


def lower_kernels(jobs: list[tuple]) -> list[tuple[Kernel, str]]:
    """(kernel, CUDA C) of every (case index, case, config, name) job, lowered in worker
    processes (call this before CUDA or torch start threads: the workers are forked)."""
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    if workers == 1:
        return [_lower(job) for job in jobs]
    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_lower, jobs, chunksize=max(1, len(jobs) // (4 * workers))))


def compile_kernels(lowered: list[tuple[Kernel, str]], arch: str, out_dir: Path,
                    spin: bool = False) -> list[Kernel]:
    """nvcc: one translation unit per kernel, in parallel, cached; with `spin`, plus the
    busy-wait kernel (`SPIN`, case -1) the timing queues launches behind. When the batch
    fails, each source is compiled alone and a failing one is its kernel's `error`."""
    sources = {kernel.name: source for kernel, source in lowered if source is not None}
    if spin:
        sources[SPIN] = SPIN_SOURCE
    options = dict(include_dirs=[CUDA_INCLUDE_DIR], ptx=False, keep_logs=True)
    try:
        cubins = compile_cubins(sources, arch, out_dir, **options)[arch] if sources else {}
        errors: dict[str, str] = {}
    except Exception:
        cubins, errors = {}, {}
        for name, source in sources.items():
            try:
                cubins.update(compile_cubins({name: source}, arch, out_dir, **options)[arch])
            except Exception as exc:
                errors[name] = f"nvcc: {exc}"[:400]
        if SPIN in errors:
            raise RuntimeError(errors[SPIN])
    kernels = [kernel for kernel, _ in lowered]
    for kernel in kernels:
        kernel.cubin = cubins.get(kernel.name)
        kernel.error = kernel.error or errors.get(kernel.name)
    return kernels + ([Kernel(-1, SPIN, {}, (1, 1, 1), (1, 1, 1), [], cubins[SPIN])]
                      if spin else [])


def check_buffers(case: Case, kernel: Kernel) -> None:
    """The kernel's buffer parameters are the case's inputs then its output, in size and
    dtype (so the arrays of `Case.kernel_layout` are what it reads)."""
    task = case.task()
    types = [task.inputs[i] for i in task.buffer_inputs] + list(task.outputs)
    want = [(t.dtype, int(np.prod(t.shape))) for t in types]
    if want != kernel.params:
        raise ValueError(f"{kernel.name}: buffer parameters {kernel.params}, expected {want}")


# ---------------------------------------------------------------- the PyTorch peer
def torch_peer(case: Case, torch, ins: list[np.ndarray]) -> tuple[Any, Any]:
    """(a zero-argument callable running the peer once on `ins` (`case.canonical()`'s),
    a callable giving its last output as float32 numpy in the canonical layout). f32:
    TF32 off (set by the caller); f16 conv: channels_last tensors (cuDNN's fast path)."""
    tensors = [torch.from_numpy(a).cuda() for a in ins]
    if case.op == "MatMul":
        a, b = tensors
        out = [None]

        def run():
            out[0] = torch.matmul(a, b)
        return run, lambda: out[0].float().cpu().numpy()
    functional = importlib.import_module("torch.nn.functional")
    x, w, bias = tensors
    if case.precision == "f16":
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.contiguous(memory_format=torch.channels_last)
    _, _, _, _, stride, pad = case.dims
    out = [None]

    def run():
        out[0] = functional.conv2d(x, w, bias, stride=stride, padding=pad)
    return run, lambda: out[0].float().contiguous().cpu().numpy()


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    got, ref = got.astype(np.float32), ref.astype(np.float32)
    return float(np.linalg.norm(got - ref) / max(float(np.linalg.norm(ref)), 1e-30))
