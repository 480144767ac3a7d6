"""The CUDA templates on the shapes the benchmark models run, each checked against numpy
on its own: the GPU check's second half of "primitives in isolation" (the first is the
kernel tests run on the device; see bench/gpu_check.py).

    python bench/gpu_templates.py OUT.json [--emulate] [--filter TEXT]

Cases (from bench/cuda_cases.py, which builds their inputs and numpy references): the
f16 tensor-core MatMul on the three BERT-base projections, the f16 implicit-GEMM
convolutions of ResNet-50's layer1, layer3 and layer4 3x3s on tensor cores and its
3-channel stem on the SIMT core with f16 storage, and one f32 SIMT MatMul. Each runs its
template's default config once on seeded inputs and is compared with the float32 numpy
reference (norm-wise relative error, 1e-2 for f16 and 1e-4 for f32, as the models).

On a GPU each kernel runs through `DeviceModule` (nvcc for this GPU's arch) and its
device time is taken from CUDA events around one more launch (a figure for the
record; bench/cuda_ops.py does the careful timing beside cuBLAS/cuDNN). `--emulate`
runs the same kernels in the emulator instead (the dry run: the same shapes, seconds in
all). OUT.json is rewritten
after every case, so a timeout keeps what was checked.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from cuda_cases import (  # noqa: E402
    CUDA,
    TOLERANCE,
    Case,
    all_cases,
    check_buffers,
    lower_kernels,
    rel_error,
)

from hidetc.backends.runtime.cuda.kernel_module import DeviceModule  # noqa: E402
from hidetc.backends.runtime.emulator import EmulatedModule, build_emulated  # noqa: E402

PICKS = [("f16", "bert qkv/proj 128x768x768"), ("f16", "bert ffn1 128x3072x768"),
         ("f16", "bert ffn2 128x768x3072"), ("f16", "resnet50 conv1 7x7 s2"),
         ("f16", "resnet50 l1 3x3 64 @56"), ("f16", "resnet50 l3 3x3 256 @14"),
         ("f16", "resnet50 l4 3x3 512 @7"), ("f32", "bert qkv/proj 128x768x768")]


def picked_cases(text: str = "") -> list[Case]:
    """The PICKS whose name contains `text`, in all_cases()'s order."""
    return [c for c in all_cases() if text in c.name and
            any(c.precision == p and name in c.name for p, name in PICKS)]


class GpuRunner:
    """Kernels on the GPU through DeviceModule, with an event-timed second launch."""

    def __init__(self, sources: dict[str, str]):
        self.module = DeviceModule(sources)
        self.drv = self.module.drv

    def run(self, name, grid, block, arrays) -> float:
        self.module.launch(name, grid, block, arrays)
        fn = self.module.function(name)
        bufs = [self.drv.mem_alloc(max(a.nbytes, 1)) for a in arrays]
        for buf, a in zip(bufs, arrays):
            self.drv.memcpy_htod(buf, a)
        start, end = self.drv.Event(), self.drv.Event()
        start.record()
        fn(*bufs, grid=tuple(grid), block=tuple(block), shared=self.module.dynamic_shared(name))
        end.record()
        end.synchronize()
        for buf in bufs:
            buf.free()
        return float(end.time_since(start))


class EmuRunner:
    def __init__(self, sources: dict[str, str]):
        self.module = EmulatedModule(build_emulated(sources))

    def run(self, name, grid, block, arrays) -> float:
        start = time.perf_counter()
        self.module.launch(name, grid, block, arrays)
        return (time.perf_counter() - start) * 1e3


def check_case(case: Case, kernel, runner) -> dict:
    row = {"case": case.name, "template": case.template.name, "config": kernel.config,
           "grid": list(kernel.grid), "block": list(kernel.block)}
    ins, ref = case.kernel_layout(*case.canonical())
    check_buffers(case, kernel)
    out = np.zeros(ref.shape, ins[0].dtype)
    start = time.perf_counter()
    extra = [np.zeros(shape, dtype) for shape, dtype in kernel.scratch]   # split-K's
    row["ms"] = runner.run(kernel.name, kernel.grid, kernel.block, [*ins, out, *extra])
    err = rel_error(out, ref)
    row.update(rel_error=err, rtol=TOLERANCE[case.precision],
               status="passed" if err <= TOLERANCE[case.precision] else "failed",
               seconds=round(time.perf_counter() - start, 2))
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--emulate", action="store_true", help="run in the emulator (no GPU)")
    p.add_argument("--filter", default="")
    a = p.parse_args(argv)
    cases = picked_cases(a.filter)
    jobs = [(i, c, c.template.default(c.task(), CUDA), f"case_{c.slug}")
            for i, c in enumerate(cases)]
    lowered = lower_kernels(jobs)
    doc = {"runner": "emulator" if a.emulate else "gpu", "cases": []}
    sources = {k.name: src for k, src in lowered if src is not None}
    runner = (EmuRunner if a.emulate else GpuRunner)(sources)
    for (kernel, _), case in zip(lowered, cases):
        if kernel.error:
            row = {"case": case.name, "status": "error", "error": kernel.error}
        else:
            try:
                row = check_case(case, kernel, runner)
            except Exception as exc:     # a fault is this case's row; a sticky one ends
                row = {"case": case.name, "status": "error",
                       "error": f"{type(exc).__name__}: {exc}"[:400]}
        doc["cases"].append(row)
        a.out.write_text(json.dumps(doc, indent=1))
        print(f"{row['status']:<7} {case.name}: " +
              (f"rel err {row['rel_error']:.2e}, {row['ms']:.3f} ms" if "rel_error" in row
               else row.get("error", "")), flush=True)
    bad = [r for r in doc["cases"] if r["status"] != "passed"]
    doc.update(passed=len(doc["cases"]) - len(bad), failed=len(bad),
               status="failed" if bad else "passed",
               failures=[f"{r['case']}: {r.get('error') or r.get('rel_error')}" for r in bad])
    a.out.write_text(json.dumps(doc, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
