"""The one-shot GPU check: what one lent GPU session can teach, in one command that
fails soft (see ../shared/device/README.md for the machine and how pycuda gets there).

    bash bench/gpu_check.sh [--dry-run] [--results DIR] [--budget S] [--only PATTERN,...]

Results go to $OUT/gpu when OUT is set (the device tool brings back only what is under
$OUT), else to --results, else bench/results/gpu-<date>: results.json (one entry per
step and per model), results.md, logs/STEP.log and steps/STEP.json, all rewritten after
every step, so a run killed at any point keeps what it measured. A compact summary
(bench/gpu_report.py) is printed last; it fits the 12,000 characters the device tool
returns.

Steps, in the order of what they teach; each is a child process in its own session with
its own cap (a fault, a hang or a kill costs that row only), clipped by the budget:
  install_pycuda  the carried wheels (.whl/) into /tmp/site, when there are any
  device          pycuda import and device query: name, SMs, memory, driver, clocks
  primitives      the intrinsics tests (cp.async zero-fill, ldmatrix x1/x2/x4 and trans,
                  mma.m16n8k16 on f16 and bf16, shuffles, votes, vector copies, f16 and
                  bf16 conversions, atomics) run ON the GPU against their independent
                  numpy references (HIDETC_KERNEL_DEVICE)
  kernels         the hand-written DSL kernel tests the same way
  templates       the tensor-core and SIMT templates on 8 model shapes vs numpy
  kernel_ab       issue 41's kernel changes before and after (bench/gpu_kernel_ab.py):
                  attention K/V double-buffered or not, split-K's protocol now and before
  runtime         the runtime's GPU tests: module load per arch (cubin, PTX JIT), CUDA
                  graph capture and replay, dynamic shared memory above 48 KB, fault
                  location, per-launch profile
  model_f16_NAME  the five models in f16, one process each (bench/gpu_model.py)
  model_bf16_NAME the five models in bf16 the same way (bfloat16 storage, the bf16
                  tensor cores; checked at the bf16 tolerance, 2e-2; no peers yet)
  peers           PyTorch eager and eager+CUDA graph (channels_last for the CNNs) for all
                  five in one process (bench/gpu_peers.py), then eager+graph f32
  model_f32_NAME  the five models in f32 (peers with TF32 off)
  dynamic_f16_bert  BERT compiled once for seq 1..512 beside static artifacts at 16, 128
                  and 384: outputs vs ONNX Runtime, device time dynamic/static
                  (bench/gpu_dynamic.py)
  peers_compile   torch.compile (reduce-overhead) for BERT-base and ResNet-50, f16
  template_tests  the template tests (awkward shapes, sampled configs; f16, bf16 in
                  tests/schedules/test_cuda_tc_bf16.py, the int8 mma layout, wraparound
                  and MatMulInteger in tests/schedules/test_cuda_int8_tc.py) on the GPU
  tune            BERT-base f16 tuned with --space 2 (how long the full space takes)
  cuda_ops        the template cases beside cuBLAS/cuDNN (bench/cuda_ops.py)
  cpu_NAME        the five models on this machine's CPU beside ONNX Runtime (hidetc bench)
Without a usable GPU (no pycuda, a broken driver) the steps that need one are recorded
as skipped with the device step's reason; the rest run. `--dry-run` (for a machine
without a GPU; at most ~6 minutes here) runs every step it can the same way: tiny
models, the emulator in place of the device, the fake driver's runtime tests, the peers
skipped when torch is absent; it is how this script is tested before the minutes count.
Exit status: 0 when every step that ran passed, 1 otherwise (the files are written
either way).
"""
from __future__ import annotations

import argparse
import fnmatch
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu_report  # noqa: E402

MODELS = ("resnet50", "inception_v3", "mobilenet_v2", "bert_base", "gpt2")
VISION = ("resnet50", "inception_v3", "mobilenet_v2")
BUDGET_S = {"gpu": 460.0, "dry-run": 360.0}
MIN_STEP_S = 10.0            # a step is started only with this much of the budget left
REPORT_S = 5.0               # kept back for the last report
CHILD_MARGIN_S = 8.0         # a child's own time box is its limit less this (it saves first)
SITE = "/tmp/site"
PRIMITIVE_TESTS = ["tests/emulator/test_emu_intrinsics.py"]
KERNEL_TESTS = ["tests/emulator/test_emu_kernels.py"]
TEMPLATE_TESTS = ["tests/schedules/test_cuda_matmul_tc.py", "tests/schedules/test_cuda_conv_tc.py",
                  "tests/schedules/test_cuda_matmul_gemv.py",
                  "tests/schedules/test_cuda_attention.py",
                  "tests/schedules/test_cuda_matmul_simt.py",
                  "tests/schedules/test_cuda_conv_gemm.py", "tests/schedules/test_cuda_reduce.py",
                  "tests/schedules/test_cuda_nhwc_kernels.py",
                  "tests/schedules/test_more_elementwise_kernels.py",
                  "tests/schedules/test_cuda_tc_bf16.py",
                  "tests/schedules/test_cuda_int8_tc.py",
                  "tests/codegen/test_cuda_codegen.py", "tests/graph/test_grid_sample.py"]
RUNTIME_TESTS = ["tests/runtime/test_cuda_runtime.py", "tests/runtime/test_cuda_runtime_dynamic.py",
                 "tests/runtime/test_cuda_runtime_gpu.py"]


@dataclass
class Run:
    """One run of the check: where it writes, what it runs on, its deadline."""
    results: Path
    mode: str                      # "gpu" | "dry-run"
    deadline: float
    python: str
    device: str = "gpu"            # what the steps run on: gpu | emulator | none
    device_note: str = ""          # why there is no GPU
    work: Path = field(default_factory=lambda: Path(
        os.environ.get("HIDETC_GPU_WORK") or Path(tempfile.gettempdir()) / "hidetc-gpu-check"))
    doc: dict = field(default_factory=dict)
    children: set = field(default_factory=set)

    @property
    def tiny(self) -> list[str]:
        return ["--tiny"] if self.mode == "dry-run" else []

    def left(self) -> float:
        return self.deadline - time.time()

    def env(self, **extra: str) -> dict:
        paths = [SITE, str(ROOT), os.environ.get("PYTHONPATH", "")]
        return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p),
                    HIDETC_GPU_WORK=str(self.work), **extra)

    def save(self) -> None:
        """results.json and results.md, rewritten (atomically) after every step."""
        for name, text in (("results.json", json.dumps(self.doc, indent=1, default=str)),
                           ("results.md", gpu_report.markdown(self.doc))):
            tmp = self.results / f".{name}.tmp"
            tmp.write_text(text)
            tmp.replace(self.results / name)


@dataclass(frozen=True)
class Step:
    name: str
    cap: float                     # seconds, before the budget clips it
    argv: list                     # the child's command line: {figures} is its JSON path,
                                   # {seconds} its time box (its limit less a margin)
    kind: str = "json"             # json: the child may write {figures}; pytest: junit XML
    needs: str = ""                # "gpu" | "torch" | "" : what it cannot run without
    env: tuple = ()                # extra environment (key, value) pairs
    skip: str = ""                 # a reason to skip it in this mode


def pytest_step(name: str, cap: float, files: list[str], run: Run, marker: str = "",
                needs_gpu: bool = True) -> Step:
    argv = [run.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf",
            "--junitxml={figures}", *files]
    argv += ["-m", marker] if marker else ["-k", "not nvcc and not spill"]
    device = "gpu" if run.device == "gpu" else "emulator"
    return Step(name, cap, argv, kind="pytest", needs="gpu" if needs_gpu else "",
                env=(("HIDETC_KERNEL_DEVICE", device),))


def model_step(name: str, precision: str, cap: float, run: Run, compile_args: str = "",
               tag: str = "") -> Step:
    argv = [run.python, str(ROOT / "bench" / "gpu_model.py"), "{figures}", "--model", name,
            "--precision", precision, "--device", run.device, "--seconds", "{seconds}",
            "--repeat", "100" if run.device == "gpu" else "3", *run.tiny]
    if compile_args:
        argv += ["--compile-args", compile_args]
    if tag:
        argv += ["--tag", tag]
    return Step(f"{tag or 'model'}_{precision}_{name}", cap, argv)


def peers_step(name: str, cap: float, plan: list[tuple[str, str, str]], run: Run) -> Step:
    argv = [run.python, str(ROOT / "bench" / "gpu_peers.py"), "{figures}", "--seconds",
            "{seconds}", "--plan", ",".join(":".join(item) for item in plan)]
    return Step(name, cap, argv, needs="torch")


def plan(run: Run) -> list[Step]:
    """Every step after `device`, in order (see the module docstring)."""
    py, bench, dry = run.python, str(ROOT / "bench"), run.mode == "dry-run"
    steps = [pytest_step("primitives", 60, PRIMITIVE_TESTS, run),
             pytest_step("kernels", 45, KERNEL_TESTS, run),
             Step("templates", 60, [py, f"{bench}/gpu_templates.py", "{figures}",
                                    *(["--emulate"] if run.device != "gpu" else [])],
                  needs="gpu"),
             Step("kernel_ab", 90, [py, f"{bench}/gpu_kernel_ab.py", "{figures}",
                                    *(["--emulate"] if run.device != "gpu" else [])],
                  needs="gpu"),
             pytest_step("runtime", 60, RUNTIME_TESTS, run,
                         marker="gpu" if run.device == "gpu" else "not gpu", needs_gpu=False)]
    steps += [model_step(m, "f16", 60, run) for m in MODELS]
    steps += [model_step(m, "bf16", 60, run) for m in MODELS]
    graph_f16 = [(m, "eager+graph-cl" if m in VISION else "eager+graph", "f16") for m in MODELS]
    steps.append(peers_step("peers", 120, graph_f16 + [(m, "eager", "f16") for m in MODELS] +
                            [(m, "eager+graph", "f32") for m in MODELS], run))
    steps += [model_step(m, "f32", 45, run) for m in MODELS]
    dynamic = [py, f"{bench}/gpu_dynamic.py", "{figures}", "--device", run.device,
               "--seconds", "{seconds}", "--repeat", "100" if run.device == "gpu" else "5"]
    if dry:
        dynamic += ["--tiny", "--range", "1..32", "--lengths", "4,16,32"]
    steps.append(Step("dynamic_f16_bert", 150, dynamic))
    steps.append(peers_step("peers_compile", 150, [("bert_base", "compile", "f16"),
                                                   ("resnet50", "compile", "f16")], run))
    steps.append(pytest_step("template_tests", 150, TEMPLATE_TESTS, run))
    tuned = model_step("bert_base", "f16", 150, run, "--tune --space 2", tag="tuned")
    steps.append(Step(tuned.name, tuned.cap, tuned.argv, needs="gpu",
                      skip="tuning measures on the GPU" if dry else ""))
    ops = [py, f"{bench}/cuda_ops.py", str(run.results), "--work",
           str(run.work / "cubins")]
    ops += ["--dry-run", "--only", "matmul", "--filter", "bert"] if dry else \
        ["--budget-s", "{seconds}", "--configs", "4"]
    steps.append(Step("cuda_ops", 120, ops, needs="gpu"))
    for m in MODELS:
        steps.append(Step(f"cpu_{m}", 60, [py, "-m", "hidetc.tools.cli", "bench", m,
                                           "--target", "cpu", "--no-tune", "--no-memory",
                                           "--repeat", "20", "--work", str(run.work / "cpu"),
                                           "--json", "{figures}", *run.tiny]))
    return steps


# ---------------------------------------------------------------- running a step


def run_child(run: Run, argv: list[str], env: dict, log: Path, limit: float) -> int | None:
    """The command in its own session, output to `log`; None when killed at `limit`."""
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env,
                                start_new_session=True, stdin=subprocess.DEVNULL)
        run.children.add(proc.pid)
        try:
            return proc.wait(timeout=max(limit, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return None
        finally:
            run.children.discard(proc.pid)


def junit_figures(path: Path) -> dict:
    """Counts and the first failures (test and first message line) of a junit XML."""
    if not path.is_file():
        return {}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as exc:
        return {"note": f"unreadable junit XML ({exc})"}
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    failures = []
    for case in root.iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            counts["failed"] += 1
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            failures.append(f"{case.get('name')}: {message[0][:200] if message else '?'}")
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return {**counts, "failures": failures[:10]}


def skip_reason(step: Step, run: Run) -> str:
    if step.skip:
        return step.skip
    if step.needs == "gpu" and run.device == "none":
        return f"no GPU ({run.device_note})"
    if step.needs == "torch":
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed"
        if run.device != "gpu":
            return f"no GPU ({run.device_note})"
    return ""


def execute(step: Step, run: Run) -> dict:
    """Run one step; its entry of results.json."""
    entry: dict = {"cap_s": step.cap}
    reason = skip_reason(step, run)
    limit = min(step.cap, run.left() - REPORT_S)
    if not reason and run.left() - REPORT_S < MIN_STEP_S:
        reason = "out of time"
    if reason:
        return dict(entry, status="skipped", reason=reason, seconds=0)
    figures = run.results / "steps" / f"{step.name}.{'xml' if step.kind == 'pytest' else 'json'}"
    figures.unlink(missing_ok=True)
    log = run.results / "logs" / f"{step.name}.log"
    box = f"{max(limit - CHILD_MARGIN_S, 1):.0f}"
    argv = [str(a).replace("{figures}", str(figures)).replace("{seconds}", box)
            for a in step.argv]
    start = time.time()
    rc = run_child(run, argv, run.env(**dict(step.env)), log, limit)
    entry.update(seconds=round(time.time() - start, 1), limit_s=round(limit), rc=rc,
                 log=str(log.relative_to(run.results)))
    if step.kind == "pytest":
        entry["figures"] = junit_figures(figures)
    elif figures.is_file():
        try:
            entry["figures"] = json.loads(figures.read_text())
        except ValueError as exc:
            entry["figures"] = {"note": f"unreadable ({exc})"}
    tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.is_file() else []
    if rc is None:
        entry.update(status="timeout", reason=f"killed at its {limit:.0f} s limit")
    elif isinstance(entry.get("figures"), dict) and entry["figures"].get("status"):
        entry["status"] = entry["figures"]["status"]
    else:
        entry["status"] = "passed" if rc == 0 else "failed"
    if entry["status"] not in ("passed", "compiled") and tail:
        entry["tail"] = tail
    return entry


# ---------------------------------------------------------------- the device step


def _attribute(name: str):
    return lambda drv, dev: dev.get_attribute(getattr(drv.device_attribute, name))


DEVICE_FACTS = {
    "driver": lambda drv, dev: drv.get_driver_version(),
    "cuda_pycuda_built_for": lambda drv, dev: drv.get_version(),
    "sms": _attribute("MULTIPROCESSOR_COUNT"),
    "sm_clock_mhz": lambda drv, dev: _attribute("CLOCK_RATE")(drv, dev) // 1000,
    "memory_clock_mhz": lambda drv, dev: _attribute("MEMORY_CLOCK_RATE")(drv, dev) // 1000,
    "memory_bus_bits": _attribute("GLOBAL_MEMORY_BUS_WIDTH"),
    "l2_bytes": _attribute("L2_CACHE_SIZE"),
    "shared_per_block": _attribute("MAX_SHARED_MEMORY_PER_BLOCK"),
    "shared_per_block_optin": _attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
    "shared_per_sm": _attribute("MAX_SHARED_MEMORY_PER_MULTIPROCESSOR"),
    "registers_per_sm": _attribute("MAX_REGISTERS_PER_MULTIPROCESSOR"),
    "registers_per_block": _attribute("MAX_REGISTERS_PER_BLOCK"),
    "max_threads_per_sm": _attribute("MAX_THREADS_PER_MULTIPROCESSOR"),
}


def device_query(out: Path) -> int:
    """Child: the device's facts into `out`: status `passed` once pycuda imports, device 0
    opens and its primary context takes a query, else `unavailable` with the reason."""
    facts: dict = {"host_cores": os.cpu_count(), "python": platform.python_version()}
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,"
                              "clocks.max.mem,power.limit,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        facts["nvidia_smi"] = (smi.stdout or smi.stderr).strip()[:300]
    except (OSError, subprocess.TimeoutExpired) as exc:
        facts["nvidia_smi"] = f"unavailable ({type(exc).__name__})"
    try:
        import pycuda.driver as drv
        drv.init()
        dev = drv.Device(0)
        context = dev.retain_primary_context()   # what every later step does first
        context.push()
        try:
            free, total = drv.mem_get_info()
        finally:
            drv.Context.pop()
        facts.update(status="passed", name=dev.name(),
                     capability=list(dev.compute_capability()),
                     memory_gib=round(total / 2**30, 1), free_gib=round(free / 2**30, 1))
    except Exception as exc:         # ImportError, the driver's errors: the reason is the row
        facts.update(status="unavailable", reason=f"{type(exc).__name__}: {exc}"[:300])
    if facts["status"] == "passed":  # each further fact on its own: none can fail the step
        for key, get in DEVICE_FACTS.items():
            try:
                facts[key] = get(drv, dev)
            except Exception as exc:
                facts[key] = f"unknown ({type(exc).__name__}: {exc})"[:120]
    for package in ("torch", "torchvision", "transformers", "onnx", "onnxruntime", "numpy",
                    "pycuda"):
        try:
            facts[f"version_{package}"] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            facts[f"version_{package}"] = None
    out.write_text(json.dumps(facts, indent=1, default=str))
    print(json.dumps(facts))
    return 0


# ---------------------------------------------------------------- the run


def results_dir(given: Path | None) -> Path:
    """$OUT/gpu whenever OUT is set (on the GPU machine nothing else comes back), else
    `given`, else bench/results/gpu-DATE."""
    if os.environ.get("OUT"):
        return Path(os.environ["OUT"]) / "gpu"
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    return given or ROOT / "bench" / "results" / f"gpu-{stamp}"


def main_run(a: argparse.Namespace) -> int:
    mode = "dry-run" if a.dry_run else "gpu"
    results = results_dir(a.results)
    for sub in ("logs", "steps"):
        (results / sub).mkdir(parents=True, exist_ok=True)
    budget = a.budget or float(os.environ.get("GPU_CHECK_BUDGET_S", BUDGET_S[mode]))
    run = Run(results, mode, time.time() + budget, a.python)
    run.work.mkdir(parents=True, exist_ok=True)
    run.doc = {"mode": mode, "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "budget_s": budget, "steps": {}}

    def stop(signum, frame):           # the device tool's timeout: keep what is known
        for pid in list(run.children):
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        run.doc["stopped"] = f"signal {signum} after {budget - run.left():.0f} s"
        run.save()
        print(gpu_report.summary(run.doc))
        sys.exit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    only = set(filter(None, a.only.split(","))) if a.only else None

    def do(step: Step) -> None:
        if only is not None and step.name not in ("install_pycuda", "device") and \
                not any(fnmatch.fnmatchcase(step.name, pattern) for pattern in only):
            return
        entry = execute(step, run)
        run.doc["steps"][step.name] = entry
        gpu_report.collect(run.doc, step.name, entry)
        run.save()
        print(gpu_report.progress_line(step.name, entry), flush=True)

    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    if wheels:
        do(Step("install_pycuda", 60, [run.python, "-m", "pip", "install", "-q", "--no-index",
                                       "--no-deps", "--upgrade", "--target", SITE,
                                       *map(str, wheels)]))
    do(Step("device", 30, [run.python, str(Path(__file__).resolve()), "device", "{figures}"]))
    device = run.doc["steps"].get("device", {})
    if device.get("status") != "passed":
        run.device_note = (device.get("figures") or {}).get("reason") or \
            device.get("reason") or "the device step failed"
        run.device = "emulator" if mode == "dry-run" else "none"
    run.doc.update(device=run.device, device_note=run.device_note)
    for step in plan(run):
        do(step)
    run.doc["finished_s"] = round(budget - run.left(), 1)
    run.save()
    print(gpu_report.summary(run.doc))
    bad = [n for n, e in run.doc["steps"].items() if e["status"] not in gpu_report.FINE]
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["device"]:
        return device_query(Path(argv[1]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true",
                   help="no GPU here: tiny models, the emulator, the fake driver")
    p.add_argument("--results", type=Path, default=None,
                   help="where to write (default: $OUT/gpu, else bench/results/gpu-DATE)")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole run (default $GPU_CHECK_BUDGET_S, else "
                        f"{BUDGET_S['gpu']:.0f}; {BUDGET_S['dry-run']:.0f} for a dry run)")
    p.add_argument("--only", default="",
                   help="comma-separated step names or patterns (model_f16_*,runtime); the "
                        "device step always runs")
    p.add_argument("--python", default=sys.executable, help="the children's interpreter")
    return main_run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
