"""GPU benchmark of the CUDA f32 SIMT MatMul template (hidetc.schedules.cuda.matmul_simt).

    python bench/cuda_ops.py RESULTS_DIR [--dry-run] [--arch sm_90] [--configs N]
                             [--shapes 4096x4096x4096,...] [--repeat 50] [--budget-s S]

For each shape (M x N x K; default 4096^3, 1024^3 and the BERT-base projections
128x768x768, 128x3072x768, 128x768x3072 -- written as M x N x K), the kernels of the
template's default config and of every config of the space (or the first N of a seeded
shuffle with --configs N) are built (lower -> CUDA C -> nvcc cubins for --arch, default:
the GPU's) and then, on the GPU (pycuda, device 0, its primary context):
- every config runs once and is checked against numpy (norm-wise relative error
  <= 1e-4; a failing config is recorded and never chosen), then timed briefly
  (--search-repeat runs) to find the best of the space within --budget-s;
- the default and the best config are timed with CUDA events around each launch:
  --warmup launches, then the median of --repeat (>= 50) launches;
- torch.matmul (cuBLAS, TF32 off) on the same shapes, same timing, when torch imports.
Prints a table and writes RESULTS_DIR/cuda_ops.json. `--dry-run` only builds (no GPU,
pycuda or torch needed) and records each default kernel's ptxas report.
"""
from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hidetc.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module  # noqa: E402
from hidetc.graph.ir import TensorType  # noqa: E402
from hidetc.schedules.cuda.matmul_simt import TEMPLATE, SimtConfig  # noqa: E402
from hidetc.schedules.task import Task  # noqa: E402
from hidetc.schedules.template import Target  # noqa: E402
from hidetc.tir.pipeline import lower  # noqa: E402
from hidetc.toolchain.nvcc import (  # noqa: E402
    compile_cubins,
    default_arch,
    parse_archs,
    ptxas_resources,
)

SHAPES = ((4096, 4096, 4096), (1024, 1024, 1024), (128, 768, 768), (128, 3072, 768),
          (128, 768, 3072))
UNITS_PER_SHAPE = 16      # translation units per shape: nvcc runs them in parallel
TOLERANCE = 1e-4
CUDA = Target(kind="cuda")


def matmul_task(m: int, n: int, k: int) -> Task:
    f32 = "float32"
    return Task("MatMul", (TensorType(f32, (m, k)), TensorType(f32, (k, n))),
                (TensorType(f32, (m, n)),), (), (None, None))


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    shapes = []
    for item in text.split(","):
        m, n, k = (int(x) for x in item.lower().split("x"))
        shapes.append((m, n, k))
    return shapes


def select_configs(task: Task, limit: int) -> list[SimtConfig]:
    """The default first, then the space (all, or `limit` of a seeded shuffle)."""
    default = TEMPLATE.default(task, CUDA)
    space = [c for c in TEMPLATE.space(task, CUDA) if c != default]
    if limit:
        space = random.Random(0).sample(space, min(limit, len(space)))
    return [default] + space


# ---------------------------------------------------------------- building
def build_shape(shape, limit: int, arch: str, out_dir: Path) -> dict:
    """Kernels of one shape: {"task", "kernels": [(name, config, fn)], "cubins"}."""
    task = matmul_task(*shape)
    tag = "x".join(map(str, shape))
    kernels = []
    for i, cfg in enumerate(select_configs(task, limit)):
        fn = lower(TEMPLATE.build(task, cfg, f"mm_{tag}_{i}"))
        kernels.append((fn.name, cfg, fn))
    units = {f"mm_{tag}_u{u}": print_cuda_module([k[2] for k in kernels[u::UNITS_PER_SHAPE]])
             for u in range(min(UNITS_PER_SHAPE, len(kernels)))}
    cubins = compile_cubins(units, arch, out_dir / tag, include_dirs=[CUDA_INCLUDE_DIR],
                            ptx=False, keep_logs=True)[arch]
    by_kernel = {}
    for u, path in enumerate(cubins[name] for name in units):
        for name, _, _ in kernels[u::UNITS_PER_SHAPE]:
            by_kernel[name] = path
    return {"task": task, "shape": shape, "kernels": kernels, "cubins": by_kernel}


def ptxas_of(built: dict) -> dict:
    name = built["kernels"][0][0]
    return ptxas_resources(built["cubins"][name]).get(name, {})


# ---------------------------------------------------------------- GPU timing
class Gpu:
    """pycuda on device 0 (primary context); modules cached per cubin."""

    def __init__(self):
        importlib.import_module("pycuda.autoprimaryctx")
        self.drv = importlib.import_module("pycuda.driver")
        self.modules: dict[Path, object] = {}
        self.name = self.drv.Context.get_device().name()

    def function(self, cubin: Path, name: str, params: str):
        """The kernel, prepared (`params`: pycuda's struct codes, "P" per pointer), so a
        launch spends as little host time as possible inside the timed window."""
        if cubin not in self.modules:
            self.modules[cubin] = self.drv.module_from_file(str(cubin))
        return self.modules[cubin].get_function(name).prepare(params)

    def time_launches(self, launch, warmup: int, repeat: int) -> float:
        """Median milliseconds of `repeat` launches, each between two CUDA events."""
        for _ in range(warmup):
            launch()
        start, end = self.drv.Event(), self.drv.Event()
        times = []
        for _ in range(repeat):
            start.record()
            launch()
            end.record()
            end.synchronize()
            times.append(start.time_till(end))
        return statistics.median(times)


def rel_error(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def launcher(gpu: Gpu, built: dict, name: str, fn, bufs):
    kernel = gpu.function(built["cubins"][name], name, "P" * len(bufs))
    grid, block = fn.attr("grid"), fn.attr("block")
    return lambda: kernel.prepared_call(grid, block, *bufs)


def measure_shape(gpu: Gpu, built: dict, args) -> dict:
    m, n, k = built["shape"]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    ref = a @ b
    bufs = [gpu.drv.to_device(a), gpu.drv.to_device(b), gpu.drv.mem_alloc(ref.nbytes)]
    search, deadline = [], time.monotonic() + args.budget_s
    for name, cfg, fn in built["kernels"]:
        if search and time.monotonic() > deadline:
            break
        run = launcher(gpu, built, name, fn, bufs)
        run()
        err = rel_error(gpu.drv.from_device(bufs[2], ref.shape, np.float32), ref)
        ms = gpu.time_launches(run, 1, args.search_repeat) if err <= TOLERANCE else None
        search.append({"config": asdict(cfg), "kernel": name, "error": err, "ms": ms})
    ok = [s for s in search if s["ms"] is not None]
    best = min(ok, key=lambda s: s["ms"]) if ok else None
    flops = 2.0 * m * n * k
    rows = {"default": search[0], "best": best}
    out = {"shape": [m, n, k], "searched": len(search), "of": len(built["kernels"]),
           "failed": [s["kernel"] for s in search if s["ms"] is None], "search": search}
    for key, row in rows.items():
        if row is None or row["ms"] is None:
            out[key] = None
            continue
        fn = next(f for name, _, f in built["kernels"] if name == row["kernel"])
        ms = gpu.time_launches(launcher(gpu, built, row["kernel"], fn, bufs), args.warmup,
                               args.repeat)
        out[key] = {**row, "ms": ms, "tflops": flops / ms / 1e9}
    return out


def measure_torch(shape, args) -> dict | None:
    """torch.matmul (cuBLAS) with TF32 off, timed like the kernels; None without torch."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    m, n, k = shape
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda")
    for _ in range(args.warmup):
        torch.matmul(a, b)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(args.repeat):
        start.record()
        torch.matmul(a, b)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    ms = statistics.median(times)
    return {"ms": ms, "tflops": 2.0 * m * n * k / ms / 1e9, "version": torch.__version__}


# ---------------------------------------------------------------- report
def _cell(row: dict | None) -> str:
    return "-" if not row else f"{row['ms']:.3f} ms {row['tflops']:.1f} TF"


def table(results: list[dict]) -> str:
    lines = ["| M x N x K | default | best of space (searched) | torch (cuBLAS) | best cfg |",
             "|---|---|---|---|---|"]
    for r in results:
        best = r.get("best") or {}
        cfg = best.get("config")
        desc = "-" if not cfg else (f"{cfg['warps']}w {cfg['lanes']}l {cfg['thread']}t "
                                    f"bk{cfg['bk']} v{int(cfg['vector'])} s{cfg['swizzle']}")
        lines.append(f"| {'x'.join(map(str, r['shape']))} | {_cell(r.get('default'))} | "
                     f"{_cell(r.get('best'))} ({r.get('searched', 0)}/{r.get('of', 0)}) | "
                     f"{_cell(r.get('torch'))} | {desc} |")
    return "\n".join(lines)


def dry_run_row(built: dict) -> dict:
    default = built["kernels"][0]
    return {"shape": list(built["shape"]), "kernels": len(built["kernels"]),
            "default": {"config": asdict(default[1]), "kernel": default[0],
                        "ptxas": ptxas_of(built)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="only build the kernels")
    ap.add_argument("--arch", default=None, help="default: the GPU's (nvidia-smi), else sm_90")
    ap.add_argument("--configs", type=int, default=0, help="space configs to try (0: all)")
    ap.add_argument("--shapes", type=parse_shapes, default=list(SHAPES))
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--search-repeat", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=60.0, help="search time per shape")
    args = ap.parse_args(argv)
    if args.repeat < 50 and not args.dry_run:
        ap.error("--repeat must be at least 50")
    arch = parse_archs(args.arch or default_arch())[0]
    args.results.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    built = [build_shape(s, args.configs, arch, args.results / "cubins") for s in args.shapes]
    doc = {"arch": arch, "build_s": round(time.monotonic() - t0, 1), "dry_run": args.dry_run}
    if args.dry_run:
        doc["results"] = [dry_run_row(b) for b in built]
    else:
        gpu = Gpu()
        doc["gpu"] = gpu.name
        doc["results"] = [{**measure_shape(gpu, b, args), "torch": measure_torch(b["shape"], args)}
                          for b in built]
        print(table(doc["results"]))
    (args.results / "cuda_ops.json").write_text(json.dumps(doc, indent=1, default=str))
    print(f"wrote {args.results / 'cuda_ops.json'} ({doc['build_s']} s of builds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
