"""Issue 41's kernel changes before and after, side by side on one GPU (the GPU check's
`kernel_ab` step), or checked in the emulator (`--emulate`: the dry run, no timings).

    python bench/gpu_kernel_ab.py OUT.json [--emulate]

Pairs (each side built from today's templates; "before" rebuilds the old form):
- attention: FusedAttention f16 at BERT-base (12 heads, 128 tokens, head 64) and GPT-2
  (12 heads, 256 tokens): K/V tiles double-buffered (now) vs copied and waited for per
  tile (before: built with the static shared-memory limit patched so only one stage
  fits).
- split-K: an f16 MatMul of long K at few tiles (64 x 3072 @ 3072 x 768: BERT's second
  FFN GEMM at 64 tokens) at the cost model's best split for the GPU: the protocol now
  (one fence pair in thread 0; partial sums read 16 accumulators at a time in a rolled
  loop over the splits) vs before issue 41 (`reduce_splits_before`: a fence in every
  thread, every partial sum read at once), and the same tiles unsplit.
Every kernel is checked against numpy (norm-wise relative error <= 1e-2, the f16
tolerance) and, on a GPU, timed with CUDA events: the median of 5 batches of 50
launches after 5 warm-up launches. OUT.json: per pair, each side's ms and ptxas
registers, and after / before.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from hidetc.backends.codegen.cuda import CUDA_INCLUDE_DIR, print_cuda_module  # noqa: E402
from hidetc.backends.runtime.emulator import EmulatedModule, build_emulated  # noqa: E402
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources  # noqa: E402
from hidetc.compute.task import Task  # noqa: E402
from hidetc.errors import ToolchainError  # noqa: E402
from hidetc.graph.ir import TensorType  # noqa: E402
from hidetc.graph.ops import get_op  # noqa: E402
from hidetc.schedules.cuda import attention, cost, matmul_tc, split_k  # noqa: E402
from hidetc.target import KNOWN_GPUS, cuda_target  # noqa: E402
from hidetc.tir import scratch  # noqa: E402
from hidetc.tir.builder import KernelBuilder  # noqa: E402
from hidetc.tir.cuda import atomic_add, load_cg, threadfence  # noqa: E402
from hidetc.tir.ir import Const, eq, ne, select, syncthreads, thread_idx  # noqa: E402
from hidetc.tir.pipeline import lower  # noqa: E402

F16 = "float16"


def reduce_splits_before(kb: KernelBuilder, acc, count, element, ws, counters, tile, split,
                         splits, threads, flag, epilogue) -> None:
    """Split-K's end as it was before issue 41 (for this comparison only)."""
    tid = thread_idx()

    def slot(s, a):
        return ((tile * splits + s) * count + a) * threads + tid

    with kb.for_range(count, kind="unroll", name="a") as a:
        kb.store(ws, (slot(split, a),), acc[element(a)])
    kb.emit(threadfence())
    kb.emit(syncthreads())
    one, zero = Const(1.0, flag.dtype), Const(0.0, flag.dtype)
    with kb.if_then(eq(tid, 0)):
        kb.emit(threadfence())
        arrived = kb.declare("arrived", "int32", atomic_add(counters[tile], 1))
        kb.emit(threadfence())
        kb.store(flag.buffer, flag.indices, select(eq(arrived, splits - 1), one, zero))
    kb.emit(syncthreads())
    with kb.if_then(ne(flag, zero)):
        with kb.for_range(count, kind="unroll", name="z") as a:
            kb.store(acc, element(a), Const(0.0, acc.dtype))
        with kb.for_range(splits, name="sp") as sp:
            with kb.for_range(count, kind="unroll", name="a") as a:
                kb.store(acc, element(a), acc[element(a)] + load_cg(ws[slot(sp, a)]))
        epilogue()
        with kb.if_then(eq(tid, 0)):
            kb.store(counters, (tile,), Const(0, "int32"))


@contextlib.contextmanager
def patched(module, name: str, value):
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def attention_task(heads: int, seq: int, d: int) -> Task:
    types = [TensorType(F16, (1, heads, seq, d)), TensorType(F16, (1, heads, d, seq)),
             TensorType(F16, (1, heads, seq, d))]
    score = (("mul", 1.0 / np.sqrt(d)),)
    (out,) = get_op("FusedAttention").infer(types, {"score": score}, [None] * 3)
    return Task("FusedAttention", tuple(types), (out,), (("score", score),), (None,) * 3)


def matmul_task(m: int, k: int, n: int) -> Task:
    return Task("MatMul", (TensorType(F16, (m, k)), TensorType(F16, (k, n))),
                (TensorType(F16, (m, n)),), (), (None, None))


def inputs_and_reference(task: Task, rng) -> tuple[list[np.ndarray], np.ndarray]:
    ins = [rng.uniform(-1, 1, t.shape).astype(np.float16) for t in task.inputs]
    if task.op == "MatMul":
        ref = ins[0].astype(np.float32) @ ins[1].astype(np.float32)
    else:
        ref = get_op(task.op).reference(ins, dict(task.attrs))[0].astype(np.float32)
    return ins, ref


def pairs(target) -> list[tuple[str, Task, list[tuple[str, Callable]]]]:
    """(pair name, task, [(side, builder of its lowered Function)])."""
    out = []
    for name, (heads, seq, d) in (("attention bert-base 12x128x64", (12, 128, 64)),
                                  ("attention gpt-2 12x256x64", (12, 256, 64))):
        task = attention_task(heads, seq, d)

        def now(task=task):
            return attention.build_attention(task, "att_now")

        def before(task=task):
            with patched(attention, "SHARED_LIMIT", 0):
                return attention.build_attention(task, "att_before")
        out.append((name, task, [("before", before), ("after", now)]))
    task = matmul_task(64, 3072, 768)
    gemm = matmul_tc.cost_gemm(task)
    base = cost.gemm_choice(gemm, matmul_tc.DEFAULTS, target)
    split = min((c for c in cost.split_choices(gemm, replace(base, splits=1), target)
                 if c.splits > 1),
                key=lambda c: cost.gemm_estimate(gemm, c, target).estimate_us)

    def split_now():
        return matmul_tc.build_tc_matmul(task, split, "splitk_now")

    def split_before():
        with patched(split_k, "reduce_splits", reduce_splits_before):
            return matmul_tc.build_tc_matmul(task, split, "splitk_before")

    def unsplit():
        return matmul_tc.build_tc_matmul(task, replace(split, splits=1), "unsplit")
    out.append((f"split-K 64x3072x768 {split}", task,
                [("before", split_before), ("after", split_now), ("unsplit", unsplit)]))
    return out


def ptxas_registers(source: str, arch: str) -> dict[str, int]:
    """ptxas's registers per kernel of `source` on `arch` (empty without nvcc)."""
    try:
        with tempfile.TemporaryDirectory() as tmp:
            built = compile_cubins({"ab": source}, [arch], tmp, ptx=False, keep_logs=True,
                                   include_dirs=[CUDA_INCLUDE_DIR])
            facts = {}
            for path in built[arch].values():
                facts.update(ptxas_resources(path))
    except ToolchainError:
        return {}
    return {k: v["registers"] for k, v in facts.items()}


def device_time_ms(module, fn, arrays: list[np.ndarray]) -> float:
    drv = module.drv
    kernel = module.function(fn.name)
    grid = tuple(fn.attr("grid")) + (1,) * (3 - len(fn.attr("grid")))
    block = tuple(fn.attr("block")) + (1,) * (3 - len(fn.attr("block")))
    shared = module.dynamic_shared(fn.name)
    bufs = [drv.mem_alloc(max(a.nbytes, 1)) for a in arrays]
    for buf, a in zip(bufs, arrays):
        drv.memcpy_htod(buf, a)
    start, end = drv.Event(), drv.Event()
    for _ in range(5):
        kernel(*bufs, grid=grid, block=block, shared=shared)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(50):
            kernel(*bufs, grid=grid, block=block, shared=shared)
        end.record()
        end.synchronize()
        times.append(end.time_since(start) / 50)
    for buf in bufs:
        buf.free()
    return float(statistics.median(times))


def run(out_path: Path, emulate: bool) -> int:
    if emulate:
        target = KNOWN_GPUS["h100-sxm"]
    else:
        from hidetc.backends.runtime.select import gpu_limits
        target = cuda_target(device=gpu_limits())
    doc: dict = {"device": "emulator" if emulate else target.name, "pairs": []}
    rng = np.random.default_rng(0)
    failures = 0
    for name, task, sides in pairs(target):
        ins, ref = inputs_and_reference(task, rng)
        fns = [(side, lower(build())) for side, build in sides]
        source = print_cuda_module([fn for _, fn in fns])
        if emulate:
            module = EmulatedModule(build_emulated({"ab": source}))
        else:
            from hidetc.backends.runtime.cuda.kernel_module import DeviceModule
            module = DeviceModule({"ab": source})
        registers = ptxas_registers(source, target.arch)
        row: dict = {"pair": name, "sides": {}}
        for side, fn in fns:
            out = np.full(task.outputs[0].shape, np.nan, np.float16)
            arrays = ins + [out] + scratch.zero_arrays(fn)
            module.launch(fn.name, fn.attr("grid"), fn.attr("block"), arrays)
            got = out.astype(np.float32)
            error = float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))
            facts = {"rel_error": error, "ok": error <= 1e-2,
                     "registers": registers.get(fn.name)}
            failures += not facts["ok"]
            if not emulate:
                facts["ms"] = device_time_ms(module, fn, arrays)
            row["sides"][side] = facts
        ms = {s: f.get("ms") for s, f in row["sides"].items()}
        if ms.get("before") and ms.get("after"):
            row["after_over_before"] = ms["after"] / ms["before"]
        doc["pairs"].append(row)
        out_path.write_text(json.dumps(doc, indent=1))
        print(f"{name}: " + ", ".join(
            f"{s} {'ok' if f['ok'] else 'WRONG'} err {f['rel_error']:.1e}"
            + (f" {f['ms']:.4f} ms" if f.get("ms") else "")
            + (f" {f['registers']} regs" if f.get("registers") else "")
            for s, f in row["sides"].items())
            + (f"; after/before {row['after_over_before']:.3f}"
               if "after_over_before" in row else ""), flush=True)
    return 1 if failures else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--emulate", action="store_true")
    a = p.parse_args(argv)
    return run(a.out, a.emulate)


if __name__ == "__main__":
    sys.exit(main())
