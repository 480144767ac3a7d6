"""GPU benchmark of the CUDA schedule templates, each case beside its PyTorch peer.

    python bench/cuda_ops.py RESULTS_DIR [--dry-run] [--only matmul|conv] [--filter TEXT]
                             [--precision f16|f32] [--configs N] [--budget-s S]
                             [--repeat 50] [--arch sm_90] [--work DIR]

Cases (bench/cuda_cases.py, which documents them and their targets): MatMul f16 on
tensor cores (matmul_tc) and f32 on the SIMT core (matmul_simt) at 4096^3, 1024^3 and
the BERT-base projections; every distinct ResNet-50 convolution (batch 1) in f16 as
hidetc runs it (ConvNHWC on tensor cores, conv_tc; the 3-channel stem as NCHW Conv,
conv_gemm) and in f32 (NCHW Conv on the SIMT core, conv_gemm).

Per case: the template's default config and, with --configs N, N more configs of its
space (a seeded sample) are built (lowering in worker processes, nvcc per kernel in
parallel, cached; --arch defaults to the GPU's). Then on the GPU (pycuda, device 0,
primary context), in two phases so the comparisons come first:
1. every case: the default kernel runs once on seeded inputs and is checked against
   numpy (norm-wise relative error <= 1e-2 for f16, 1e-4 for f32), then timed; the
   peer (torch.matmul = cuBLAS, F.conv2d = cuDNN with cudnn.benchmark; f32 with TF32
   off in both; f16 conv with channels_last tensors) is checked and timed the same way;
2. the searched configs (built meanwhile in a background thread), each checked, then
   timed with --search-repeat launches, within an equal share of what is left of
   --budget-s per case; the best is re-timed like the default.
Timing (both sides alike): --warmup launches, then a GPU busy-wait kernel long enough
for the host to queue all --repeat launches, each between two CUDA events, so the
events measure back-to-back device time, not the host's launch overhead (which is
larger than many of these kernels); the median of --repeat (>= 50). `queued` says
whether the queue stayed full (the wait is doubled and the run retried up to 3 times
otherwise). Inputs stay in L2 across launches on both sides.

Ratio = hidetc's time / the peer's; a case meets its target when ratio <= bound.
Writes RESULTS_DIR/cuda_ops.json (rewritten after every case: a timeout keeps what was
measured) and cuda_ops.md (the table). A kernel that fails to build is recorded (and
not run); the rest go on. `--dry-run` needs no GPU, pycuda or torch: it builds every
kernel (the search sample is seeded per case, so it builds exactly what a GPU run with
the same --configs builds) and records each one's ptxas report (registers, shared
memory, spills); its exit status is 1 when a kernel failed to build.
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from cuda_cases import (  # noqa: E402
    SPIN,
    TOLERANCE,
    Case,
    Kernel,
    all_cases,
    check_buffers,
    compile_kernels,
    lower_kernels,
    rel_error,
    select_configs,
    torch_peer,
)
from gpu_peers import open_torch  # noqa: E402

from hidetc.backends.toolchain.nvcc import default_arch, parse_archs  # noqa: E402

PEER = {"matmul": "torch.matmul (cuBLAS)", "conv": "torch conv2d (cuDNN)"}


# ---------------------------------------------------------------- timing
class Clock:
    """CUDA events and a GPU busy-wait for one API (pycuda or torch)."""

    def __init__(self, event, sync, elapsed, sleep):
        self.event, self.sync, self.elapsed, self.sleep = event, sync, elapsed, sleep

    def times(self, launch, warmup: int, repeat: int) -> tuple[list[float], bool]:
        """(ms of each of `repeat` launches queued behind a busy-wait, whether the queue
        stayed full: the GPU had not reached the first event when the last was queued)."""
        events = [self.event() for _ in range(repeat + 1)]
        start = time.perf_counter()
        for _ in range(max(warmup, 1)):
            launch()
            events[0].record()
        host_ms = (time.perf_counter() - start) * 1e3 / max(warmup, 1)
        self.sync()
        wait_ms = 2.0 * host_ms * repeat + 2.0
        for _ in range(3):
            self.sleep(wait_ms)
            events[0].record()
            for event in events[1:]:
                launch()
                event.record()
            queued = not events[0].query()
            events[-1].synchronize()
            if queued:
                break
            wait_ms *= 2
        return [self.elapsed(a, b) for a, b in zip(events, events[1:])], queued


class Gpu:
    """pycuda on device 0 (primary context): modules cached per cubin, the busy-wait."""

    def __init__(self, kernels: list[Kernel]):
        importlib.import_module("pycuda.autoprimaryctx")
        self.drv = drv = importlib.import_module("pycuda.driver")
        self.device = drv.Context.get_device()
        self.name = self.device.name()
        self.modules: dict[Path, object] = {}
        spin = next(k for k in kernels if k.name == SPIN)
        self.spin = self.function(spin)

        def sleep(ms):
            self.spin.prepared_call((1, 1, 1), (1, 1, 1), int(ms * 1e6))
        self.clock = Clock(drv.Event, drv.Context.synchronize,
                           lambda a, b: float(b.time_since(a)), sleep)

    def function(self, kernel: Kernel):
        if kernel.cubin not in self.modules:
            self.modules[kernel.cubin] = self.drv.module_from_file(str(kernel.cubin))
        codes = "Q" if kernel.name == SPIN else "P" * (len(kernel.params) + len(kernel.scratch))
        fn = self.modules[kernel.cubin].get_function(kernel.name)
        if kernel.shared > 48 * 1024:
            fn.set_attribute(self.drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                             kernel.shared)
        return fn.prepare(codes)

    def launcher(self, kernel: Kernel, pointers: list[int]):
        fn, grid, block = self.function(kernel), kernel.grid, kernel.block
        return lambda: fn.prepared_call(grid, block, *pointers, shared_size=kernel.shared)


def torch_clock(torch, gpu: Gpu) -> Clock:
    """torch's events; its busy-wait is torch.cuda._sleep (cycles at the GPU's clock)."""
    khz = gpu.device.get_attribute(gpu.drv.device_attribute.CLOCK_RATE)

    def sleep(ms):
        torch.cuda._sleep(int(ms * khz))
    return Clock(lambda: torch.cuda.Event(enable_timing=True), torch.cuda.synchronize,
                 lambda a, b: float(a.elapsed_time(b)), sleep)


# ---------------------------------------------------------------- measuring
class Bench:
    def __init__(self, args, cases: list[Case], planned: list[int], kernels: list[Kernel],
                 doc: dict):
        self.args, self.cases, self.planned, self.doc = args, cases, planned, doc
        self.by_case: dict[int, list[Kernel]] = {}
        for k in kernels:
            self.by_case.setdefault(k.case, []).append(k)
        self.gpu = Gpu(kernels)
        self.torch, note = open_torch()
        self.tclock = torch_clock(self.torch, self.gpu) if self.torch else None
        doc.update(gpu=self.gpu.name, torch=note or self.torch.__version__)
        self.state: dict[int, dict] = {}    # case -> device buffers, reference, output

    def prepare(self, i: int) -> dict:
        case, drv = self.cases[i], self.gpu.drv
        ins, ref = case.canonical()
        kins, kref = case.kernel_layout(ins, ref)
        out = np.empty(kref.shape, kins[0].dtype)
        bufs = [drv.to_device(a) for a in kins] + [drv.mem_alloc(out.nbytes)]
        self.state[i] = {"ins": ins, "ref": ref, "kref": kref, "out": out, "bufs": bufs,
                         "ptrs": [int(b) for b in bufs]}
        return self.state[i]

    def run_kernel(self, i: int, kernel: Kernel, repeat: int, warmup: int) -> dict:
        """Check `kernel` once against the reference; time it when it passes."""
        case, st, drv = self.cases[i], self.state[i], self.gpu.drv
        if kernel.error:
            return {"kernel": kernel.name, "config": kernel.config, "build_error": kernel.error}
        check_buffers(case, kernel)
        extra = [drv.to_device(np.zeros(shape, dtype)) for shape, dtype in kernel.scratch]
        st.setdefault("scratch", []).extend(extra)      # split-K's buffers, kept alive
        launch = self.gpu.launcher(kernel, st["ptrs"] + [int(b) for b in extra])
        drv.memset_d8(st["ptrs"][-1], 0, st["out"].nbytes)
        launch()
        drv.memcpy_dtoh(st["out"], st["bufs"][-1])
        row = {"kernel": kernel.name, "config": kernel.config,
               "error": rel_error(st["out"], st["kref"])}
        if row["error"] <= TOLERANCE[case.precision]:   # else: recorded, never chosen
            row.update(timing(self.gpu.clock, launch, warmup, repeat, case.flops))
        return row

    def run_peer(self, i: int) -> dict | None:
        if self.torch is None:
            return None
        case, st = self.cases[i], self.state[i]
        run, result = torch_peer(case, self.torch, st["ins"])
        run()
        self.torch.cuda.synchronize()
        row = {"what": PEER[case.group], "error": rel_error(result(), st["ref"])}
        row.update(timing(self.tclock, run, max(self.args.warmup, 10), self.args.repeat,
                          case.flops))
        return row

    def phase1(self, i: int) -> dict:
        """The default config and the peer of case `i`."""
        case, args = self.cases[i], self.args
        kernels = self.by_case[i]
        row = describe(case, self.planned[i])
        try:
            self.prepare(i)
            row["default"] = self.run_kernel(i, kernels[0], args.repeat, args.warmup)
            row["default"]["ptxas"] = kernels[0].ptxas()
            row["peer"] = self.run_peer(i)
        except Exception as exc:     # recorded; a sticky CUDA error fails the rest too
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        return finish(row)

    def phase2(self, i: int, row: dict, kernels: list[Kernel], seconds: float) -> dict:
        """The searched configs of case `i` within `seconds`; the best is re-timed."""
        args, end = self.args, time.monotonic() + seconds
        search = [dict(row["default"], searched_ms=row["default"].get("ms"))] \
            if row.get("default") else []
        try:
            for kernel in kernels:
                if time.monotonic() > end:
                    break
                r = self.run_kernel(i, kernel, args.search_repeat, 2)
                search.append(dict(r, searched_ms=r.get("ms")))
            ok = [s for s in search if s.get("searched_ms") is not None]
            best = min(ok, key=lambda s: s["searched_ms"]) if ok else None
            if best is not None and best["kernel"] != row["default"]["kernel"]:
                kernel = next(k for k in kernels if k.name == best["kernel"])
                best = dict(best, **timing(self.gpu.clock, self.gpu.launcher(
                    kernel, self.state[i]["ptrs"]), args.warmup, args.repeat, self.cases[i].flops))
                best["ptxas"] = kernel.ptxas()
            row["best"] = best
        except Exception as exc:
            row["search_error"] = f"{type(exc).__name__}: {exc}"[:400]
        row["searched"] = len(search)
        row["failed"] = [s["kernel"] for s in search if s.get("searched_ms") is None]
        row["search"] = [{k: s.get(k) for k in ("kernel", "config", "error", "build_error",
                                                "searched_ms")} for s in search]
        return finish(row)


def timing(clock: Clock, launch, warmup: int, repeat: int, flops: float) -> dict:
    times, queued = clock.times(launch, warmup, repeat)
    ms = statistics.median(times)
    return {"ms": ms, "min_ms": min(times), "tflops": flops / ms / 1e9, "queued": queued}


def describe(case: Case, kernels: int) -> dict:
    return {"case": case.name, "group": case.group, "precision": case.precision,
            "op": case.op, "template": case.template.name, "task": case.task().signature(),
            "dims": list(case.dims), "bound": case.bound, "target": case.target,
            "kernels": kernels}


def finish(row: dict) -> dict:
    """Ratios (hidetc ms / peer ms), whether the target is met, which config won."""
    peer = (row.get("peer") or {}).get("ms")
    default, best = row.get("default") or {}, row.get("best") or {}
    for key, r in (("default", default), ("best", best)):
        row[f"ratio_{key}"] = r["ms"] / peer if peer and r.get("ms") else None
    ratio = min((r for r in (row["ratio_default"], row["ratio_best"]) if r), default=None)
    row["met"] = None if ratio is None or row["bound"] is None else ratio <= row["bound"]
    winner = best if best.get("ms") and best["ms"] < default.get("ms", float("inf")) else default
    row["won"] = None if not winner.get("ms") else (
        "default" if winner.get("kernel") == default.get("kernel") else "searched")
    row["won_config"] = winner.get("config")
    return row


# ---------------------------------------------------------------- report
def cfg_text(cfg: dict | None) -> str:
    if not cfg:
        return "-"
    parts = []
    for k, v in cfg.items():
        v = "x".join(map(str, v)) if isinstance(v, (list, tuple)) else int(v) if \
            isinstance(v, bool) else v
        parts.append(f"{k}={v}")
    return " ".join(parts)


def _ms(r: dict | None) -> str:
    if not r:
        return "-"
    if r.get("ms") is None:
        return "BUILD FAIL" if "build_error" in r else \
            f"FAIL (err {r['error']:.1e})" if "error" in r else "-"
    return f"{r['ms'] * 1e3:.1f} us {r['tflops']:.0f} TF" + ("" if r.get("queued", True)
                                                            else " (unqueued)")


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def table(doc: dict) -> str:
    lines = [f"GPU: {doc.get('gpu', '-')}; torch {doc.get('torch', '-')}; arch "
             f"{doc.get('arch')}; median of {doc.get('repeat')} queued launches; ratio = "
             "hidetc time / peer time", "",
             "| case | prec | template | default | best (searched/of) | peer | default/peer "
             "| best/peer | target | met | won: config |", "|" + "---|" * 11]
    for r in doc.get("cases", []):
        failed = f", {len(r['failed'])} FAIL" if r.get("failed") else ""
        best = f"{_ms(r.get('best'))} ({r.get('searched', 0)}/{r['kernels']}{failed})" \
            if r.get("searched") else "-"
        met = {True: "yes", False: "NO", None: "-"}[r.get("met")]
        won = f"{r['won']}: {cfg_text(r.get('won_config'))}" if r.get("won") else "-"
        bound = f"<= {r['bound']:.2f}" if r.get("bound") else "-"
        lines.append(f"| {r['case']} | {r['precision']} | {r['template']} | "
                     f"{_ms(r.get('default'))} | {best} | {_ms(r.get('peer'))} | "
                     f"{_ratio(r.get('ratio_default'))} | {_ratio(r.get('ratio_best'))} | "
                     f"{bound} | {met} | {won} |")
        if r.get("error"):
            lines.append(f"| ^ error: {r['error']} |" + " |" * 10)
    return "\n".join(lines)


def dry_table(doc: dict) -> str:
    lines = ["| case | prec | template | kernels | default config | regs | smem | spills "
             "| max spills (all) | build failures |", "|" + "---|" * 10]
    for r in doc["cases"]:
        p = r["default"]["ptxas"]
        lines.append(f"| {r['case']} | {r['precision']} | {r['template']} | {r['kernels']} | "
                     f"{cfg_text(r['default']['config'])} | {p.get('registers')} | "
                     f"{p.get('shared_bytes')} | {p.get('spills')} | "
                     f"{max(q.get('spills', 0) for q in r['ptxas'])} | "
                     f"{sum(1 for q in r['ptxas'] if q.get('build_error'))} |")
    return "\n".join(lines)


def write(results: Path, doc: dict) -> None:
    (results / "cuda_ops.json").write_text(json.dumps(doc, indent=1, default=str))
    (results / "cuda_ops.md").write_text(
        "# CUDA templates vs PyTorch\n\n" + (dry_table(doc) if doc["dry_run"] else table(doc))
        + "\n")


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="only build (no GPU needed)")
    ap.add_argument("--only", choices=["matmul", "conv"], default=None)
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    ap.add_argument("--precision", choices=["f16", "f32"], default=None)
    ap.add_argument("--arch", default=None, help="default: the GPU's (nvidia-smi), else sm_90")
    ap.add_argument("--configs", type=int, default=0, help="space configs to search per case")
    ap.add_argument("--budget-s", type=float, default=300.0,
                    help="wall seconds for the whole run; the search gets what is left")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--search-repeat", type=int, default=10)
    ap.add_argument("--work", type=Path, default=None, help="cubins (default RESULTS/cubins)")
    args = ap.parse_args(argv)
    if args.repeat < 50 and not args.dry_run:
        ap.error("--repeat must be at least 50")
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    arch = parse_archs(args.arch or default_arch())[0]
    args.results.mkdir(parents=True, exist_ok=True)
    cubins = args.work or args.results / "cubins"
    cases = [c for c in all_cases() if args.only in (None, c.group) and args.filter in c.name
             and args.precision in (None, c.precision)]
    plans = [select_configs(c, args.configs) for c in cases]
    jobs = [(i, c, cfgs[0], f"k_{c.slug}_d") for i, (c, cfgs) in enumerate(zip(cases, plans))]
    search_jobs = [(i, c, cfg, f"k_{c.slug}_{j}") for i, (c, cfgs) in
                   enumerate(zip(cases, plans)) for j, cfg in enumerate(cfgs[1:], 1)]
    doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "arch": arch,
           "dry_run": args.dry_run, "configs": args.configs, "repeat": args.repeat,
           "budget_s": args.budget_s, "cases": []}
    lowered = lower_kernels(jobs + search_jobs)
    kernels = compile_kernels(lowered[:len(jobs)], arch, cubins, spin=True)
    if args.dry_run:
        kernels += compile_kernels(lowered[len(jobs):], arch, cubins)
        doc["build_s"] = round(time.monotonic() - t0, 1)
        for i, case in enumerate(cases):
            own = [k for k in kernels if k.case == i]
            for k in own:
                if not k.error:
                    check_buffers(case, k)
            row = describe(case, len(own))
            row["default"] = {"kernel": own[0].name, "config": own[0].config,
                              "ptxas": own[0].ptxas(), "build_error": own[0].error}
            row["ptxas"] = [{"kernel": k.name, "config": k.config, "build_error": k.error,
                             **k.ptxas()} for k in own]
            doc["cases"].append(row)
        write(args.results, doc)
        print(dry_table(doc))
        failed = [k for k in kernels if k.error]
        for k in failed:
            print(f"FAILED {k.name}: {k.error}")
        print(f"dry run: built {len(kernels) - len(failed)} of {len(kernels)} kernels "
              f"({len(cases)} cases, arch {arch}) in {doc['build_s']} s; wrote "
              f"{args.results / 'cuda_ops.json'}")
        return 1 if failed else 0
    doc["build_s"] = round(time.monotonic() - t0, 1)
    searched: dict = {}

    def build_search():            # nvcc in the background while phase 1 measures
        try:
            searched["kernels"] = compile_kernels(lowered[len(jobs):], arch, cubins)
        except Exception as exc:
            searched["error"] = f"{type(exc).__name__}: {exc}"[:400]
    builder = threading.Thread(target=build_search, daemon=True)
    builder.start()
    bench = Bench(args, cases, [len(p) for p in plans], kernels, doc)
    for i, case in enumerate(cases):
        if time.monotonic() > deadline:
            doc["cases"].append(dict(describe(case, 0), error="skipped: out of time"))
            continue
        doc["cases"].append(bench.phase1(i))
        write(args.results, doc)
        print(f"{case.precision} {case.name}: ratio {_ratio(doc['cases'][-1]['ratio_default'])}",
              flush=True)
    if search_jobs:
        builder.join(max(0.0, deadline - time.monotonic()))
        doc["search_build"] = searched.get("error") or (
            "not finished in time" if builder.is_alive() else "ok")
        by_case: dict[int, list[Kernel]] = {}
        for k in searched.get("kernels", []):
            by_case.setdefault(k.case, []).append(k)
        todo = [i for i in range(len(cases)) if by_case.get(i) and i in bench.state]
        for n, i in enumerate(todo):
            share = (deadline - time.monotonic()) / (len(todo) - n)
            if share < 1.0:
                break
            doc["cases"][i] = bench.phase2(i, doc["cases"][i], by_case[i], share)
            write(args.results, doc)
    doc["total_s"] = round(time.monotonic() - t0, 1)
    write(args.results, doc)
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
