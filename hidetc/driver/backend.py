"""What differs per target, in one object per target: everything a compile does that
depends on which machine it is for. No other module of the compiler compares a target's
name (`tests/architecture/test_targets_compared.py` holds the tree to it); they ask the
compile's backend.

A backend owns:
  - its machine: `machine(cfg)` (detected, or named: `--cpu-cores`, `--cpu-isa`,
    `--gpu`, `--arch`), whether that machine is this host (`on_this_machine`: tuning
    measures only there), the facts that key its tuning records (`record_facts`) and its
    toolchain's identity (`toolchain`), whether an artifact can be verified here;
  - its graph passes after the precision lowering (`graph_passes(precision)`, the layout
    policy among them) and the precisions it computes (`check_precision`);
  - its fusion rules (`refusals`: the producers an anchor does not take as prologues);
  - its schedules (`schedules`: the package of rules and templates, one interface:
    `hidetc.schedules.protocol.ScheduleModule`) and its default search space; what a
    tuning farm's measuring actor holds (`measuring_gpus`);
  - its measurer and candidate builder for tuning (`measure`, `prebuild`);
  - how the plan's kernels are built and what the manifest records of them (`build`,
    `manifest_facts`, `context_memory`).
`backend_for(name)` is the one place a target's name (or "auto") becomes a backend;
`backend_of(machine)` gives a Target's.

- `CpuBackend`: the machine is this host's cpu (`target.detect_cpu`, or `--cpu-cores` /
  `--cpu-isa` of another); the kernels one shared library built by gcc for its ISA.
- `CudaBackend`: the visible GPU when it is one of the archs built and no other GPU is
  named, else `--gpu NAME`, else the first arch's reference GPU; the kernels a few
  translation units built by nvcc into cubins per arch, with ptxas's resources.
"""
from __future__ import annotations

from pathlib import Path
from typing import Collection, Mapping, Optional, Sequence

from hidetc import cpu_isa
from hidetc.backends.runtime.cuda.context import staged_bytes
from hidetc.backends.runtime.select import gpu_available, gpu_limits, gpu_name
from hidetc.backends.toolchain.nvcc import default_arch, parse_archs
from hidetc.driver.build import build_cpu_library, launch_table
from hidetc.driver.build_cuda import build_cuda_modules
from hidetc.driver.config import CompileConfig, bf16_needs, f16_needs_cuda
from hidetc.driver.launch import ExecutionPlan
from hidetc.driver.tune.keys import cpu_arch, cpu_device, gcc_version, nvcc_version
from hidetc.driver.tune.measure import measure_cpu, prebuild_cpu
from hidetc.driver.tune.measure_cuda import measure_cuda, prebuild_cuda
from hidetc.errors import ConfigError
from hidetc.fusion.partition import NO_GATHER, NO_GATHERING_PROLOGUES
from hidetc.graph.passes.choose_layout import wants_nhwc, wants_nhwc_cpu
from hidetc.graph.pipeline import (
    ATTENTION_PASSES,
    CPU_HALF_PASSES,
    CUDA_BF16_PASSES,
    bf16_passes,
    layout_passes,
)
from hidetc.schedules import cpu as cpu_schedules
from hidetc.schedules import cuda as cuda_schedules
from hidetc.schedules.cpu import INTEGER_ANCHORS
from hidetc.schedules.cpu.gemm_int8 import int8_feature
from hidetc.target import (
    CpuTarget,
    CudaTarget,
    Target,
    cuda_target,
    detect_cpu,
    usable_cores,
)


class CpuBackend:
    kind = "cpu"
    measuring_gpus = 0         # what a farm's measuring actor holds (`tune.ray_farm`)
    schedules = cpu_schedules
    # the cpu candidates are gcc builds on a few cores: a short list by default
    default_space = 1
    # the channels-last direct conv reads its input along contiguous channels: a
    # Transpose into it as a prologue turns every load into a gather
    # (bench/results/2026-12-06-decision-notes.md)
    refusals = {**NO_GATHERING_PROLOGUES, "ConvNHWC": ("Transpose",) + NO_GATHER}
    measure = staticmethod(measure_cpu)
    prebuild = staticmethod(prebuild_cpu)

    def graph_passes(self, precision: str, keep_f32: Sequence[str] = ()) -> tuple:
        """Half-precision MatMuls/Convs widened to float32 (the templates are float32
        only), then channels-last convolutions (`wants_nhwc_cpu`); bf16: then the GEMM
        anchors marked to compute their products in bf16 (`compute_bf16`), but for the
        nodes named in `keep_f32`."""
        bf16 = bf16_passes(keep_f32) if precision == "bf16" else ()
        return CPU_HALF_PASSES + layout_passes(wants_nhwc_cpu) + bf16

    def check_precision(self, precision: str, named: bool, machine: CpuTarget) -> None:
        """The cpu computes in f32 (f16 models compute there between Casts) and in bf16
        on a machine with AVX512_BF16 (`machine` checks it: this host's, or the named
        --cpu-isa)."""
        if precision == "f16":
            picked = "" if named else ", and --target auto picked cpu (no usable CUDA GPU here)"
            raise ConfigError(f16_needs_cuda(picked))

    def machine(self, cfg: CompileConfig) -> CpuTarget:
        """This host's cpu (or the named --cpu-isa / --cpu-cores: `avx512_bf16` for a CPU
        with AVX512_BF16); a bf16 compile for a machine without AVX512_BF16 is a
        one-line ConfigError naming the missing feature."""
        machine = detect_cpu(cores=cfg.cpu_cores, isa=cfg.cpu_isa)
        if cfg.precision == "bf16" and cpu_isa.BF16 not in machine.features:
            where = f"--cpu-isa {cfg.cpu_isa}" if cfg.cpu_isa else "this CPU"
            has = ", ".join((machine.isa, *machine.features))
            raise ConfigError(bf16_needs(where, has))
        return machine

    @staticmethod
    def runs_kernels(machine: CpuTarget) -> bool:
        """Whether this CPU can run kernels of the machine's ISA (a forced ISA it lacks
        cross-compiles: no tuning, no verification)."""
        return cpu_isa.runs_here(cpu_isa.ISAS[machine.isa])

    def on_this_machine(self, machine: CpuTarget) -> bool:
        """Candidates measured here rank as they will run there: the ISA runs here and
        the core count is this process's."""
        return self.runs_kernels(machine) and machine.cores == usable_cores()

    def why_not_here(self, machine: CpuTarget) -> str:
        if not self.runs_kernels(machine):
            return (f"{cpu_isa.ENV}={machine.isa}: this CPU lacks "
                    f"{cpu_isa.ISAS[machine.isa].host_flag}")
        return (f"the kernels are shaped for {machine.cores} cores and this process has "
                f"{usable_cores()}")

    def record_facts(self, machine: CpuTarget, present: bool) -> tuple[str, str]:
        """(arch, device) of the tuning records' key."""
        return cpu_arch(machine), cpu_device()

    def toolchain(self) -> str:
        return gcc_version()

    def cannot_verify(self, machine: CpuTarget) -> Optional[str]:
        return None if self.runs_kernels(machine) else \
            f"this CPU lacks {machine.isa} (cross-compiled)"

    def build(self, plan: ExecutionPlan, entries: Mapping, root: Path, cfg: CompileConfig,
              dump_dir: Optional[str], more: Sequence[ExecutionPlan] = (),
              hints: Sequence[Mapping[str, int]] = ()) -> dict:
        """Build the kernels under `root`/kernels (of `plan` and of the dispatch variants
        `more`): the manifest keys they need (`cpu.launches`, and per further variant
        `cpu.variant_launches`), and `resources` per kernel (its scratch bytes per
        thread)."""
        library, launches, resources = build_cpu_library(plan, entries, root / "kernels",
                                                         dump_dir=dump_dir, more=more)
        cpu = {"launches": launch_table(launches[0])}
        if more:
            cpu["variant_launches"] = [launch_table(v) for v in launches[1:]]
        return {"library": str(library.relative_to(root)), "cpu": cpu,
                "resources": resources}

    def manifest_facts(self, machine: CpuTarget, precision: str = "f32",
                       ops: Collection[str] = ()) -> dict:
        """The ISA of the kernels and the machine features they use (a bf16 artifact:
        AVX512_BF16, and AMX-BF16 where the machine has it -- its kernels then use the
        AMX tiles, `gemm_bf16.block_call`; launches of integer anchors (`ops`): the int8
        block's feature, `gemm_int8.int8_feature`): a host without one refuses to load
        it."""
        used = list(cpu_isa.bf16_features(machine.features)) if precision == "bf16" else []
        if any(op in INTEGER_ANCHORS for op in ops):
            used += int8_feature(machine)
        return {"cpu_isa": machine.isa, "cpu_features": used}

    def space_set(self, arch: Optional[str] = None) -> tuple:
        """(label, machine, templates) for `hidetc inspect --space`: this host's cpu (the
        spaces depend on the ISA, not on the core count); the bf16 templates too."""
        bf16 = {f"{op}/bf16": t for op, t in self.schedules.BF16_TEMPLATES.items()}
        return self.kind, detect_cpu(), {**self.schedules.TEMPLATES, **bf16}

    def context_memory(self, arena_bytes: int, inputs: list[dict], outputs: list[dict],
                       resources: Mapping[str, dict]) -> dict:
        """The manifest's per-context memory: a cpu context is its arena (inputs and
        outputs are the caller's arrays); each OS thread that runs kernels (a caller and
        its OpenMP team) also keeps a scratch stack of up to `scratch_bytes_per_thread`
        (None where a kernel's scratch is sized at run time)."""
        scratch = [r.get("scratch_bytes") for r in resources.values()]
        return {"context_bytes": int(arena_bytes),
                "scratch_bytes_per_thread": None if None in scratch else max(scratch, default=0)}


class CudaBackend:
    kind = "cuda"
    measuring_gpus = 1         # a farm's measuring actor holds its node's GPU
    schedules = cuda_schedules
    default_space = 2          # the whole hardware-centric space: measured on the GPU
    refusals = NO_GATHERING_PROLOGUES
    measure = staticmethod(measure_cuda)
    prebuild = staticmethod(prebuild_cuda)

    def graph_passes(self, precision: str, keep_f32: Sequence[str] = ()) -> tuple:
        """bf16: first bfloat16 storage (`CUDA_BF16_PASSES`; f16's lowering ran before,
        `PRECISION_PASSES`); f16 and bf16: channels-last tensor-core convolutions
        (`wants_nhwc`; f32 graphs stay NCHW: the SIMT GEMM is NCHW); then attention
        chains fused. `keep_f32` (the cpu's bf16 recovery) is not read: every tensor
        is stored in bfloat16 here."""
        storage = CUDA_BF16_PASSES if precision == "bf16" else ()
        layout = layout_passes(wants_nhwc) if precision in ("f16", "bf16") else ()
        return storage + layout + ATTENTION_PASSES

    def check_precision(self, precision: str, named: bool, machine: CudaTarget) -> None:
        """f32, f16 and bf16 all compute here (the archs built, sm_80 and newer, have
        f16 and bf16 tensor cores)."""

    @staticmethod
    def archs(cfg: CompileConfig) -> tuple[str, ...]:
        """The archs to build: --arch, else the named GPU's, else the visible GPU's
        (sm_90 without one)."""
        if cfg.arch:
            return parse_archs(cfg.arch)
        if cfg.gpu:
            return (cuda_target(gpu=cfg.gpu).arch,)
        return (default_arch(),)

    def machine(self, cfg: CompileConfig) -> CudaTarget:
        archs = self.archs(cfg)
        if cfg.gpu is not None:
            named = cuda_target(gpu=cfg.gpu)
            if named.arch not in archs:
                raise ConfigError(f"--gpu {cfg.gpu} is {named.arch}, but --arch builds "
                                  f"{','.join(archs)}")
            return named
        if gpu_available() and default_arch() in archs:
            return cuda_target(device=gpu_limits())
        return cuda_target(arch=archs[0])

    def on_this_machine(self, machine: CudaTarget) -> bool:
        """The visible GPU is the machine: its own reported target equals this one (a
        name from nvidia-smi could be spelled otherwise than pycuda's)."""
        return gpu_available() and machine == cuda_target(device=gpu_limits())

    def why_not_here(self, machine: CudaTarget) -> str:
        if not gpu_available():
            return "tuning for cuda measures on the GPU and none is visible here"
        return (f"the kernels are built for {machine.name} ({machine.arch}), not this "
                f"machine's {gpu_name()} ({default_arch()})")

    def record_facts(self, machine: CudaTarget, present: bool) -> tuple[str, str]:
        return machine.arch, gpu_name() if present else "none"

    def toolchain(self) -> str:
        return nvcc_version()

    def cannot_verify(self, machine: CudaTarget) -> Optional[str]:
        return None if gpu_available() else "no CUDA GPU here (cross-compiled)"

    def build(self, plan: ExecutionPlan, entries: Mapping, root: Path, cfg: CompileConfig,
              dump_dir: Optional[str], more: Sequence[ExecutionPlan] = (),
              hints: Sequence[Mapping[str, int]] = ()) -> dict:
        section, resources = build_cuda_modules(plan, entries, root / "kernels",
                                                self.archs(cfg), dump_dir=dump_dir,
                                                more=more, hints=hints)
        return {"library": None, "cuda": section, "resources": resources}

    def manifest_facts(self, machine: CudaTarget, precision: str = "f32",
                       ops: Collection[str] = ()) -> dict:
        return {}

    def space_set(self, arch: Optional[str] = None) -> tuple:
        """(label, machine, templates) for `hidetc inspect --space`: the reference GPU of
        `arch` (sm_90 without one)."""
        return self.kind, cuda_target(arch), self.schedules.TEMPLATES

    def context_memory(self, arena_bytes: int, inputs: list[dict], outputs: list[dict],
                       resources: Mapping[str, dict]) -> dict:
        """The manifest's per-context memory: a cuda context's device bytes, its arena
        and one I/O buffer for the inputs and outputs (`runtime.cuda.context`; the same
        I/O bytes again in pinned host memory)."""
        io = staged_bytes(inputs) + staged_bytes(outputs)
        return {"context_bytes": int(arena_bytes) + io, "io_bytes": io}


Backend = CpuBackend | CudaBackend
BACKENDS: dict[str, Backend] = {"cpu": CpuBackend(), "cuda": CudaBackend()}


def backend_for(name: str) -> Backend:
    """The backend of a target name; "auto": cuda when a CUDA GPU and pycuda are usable
    here, else cpu (decided here, once per compile)."""
    if name == "auto":
        name = "cuda" if gpu_available() else "cpu"
    if name not in BACKENDS:
        raise ConfigError(f"unknown target {name!r}; expected one of "
                          f"{', '.join(['auto', *BACKENDS])}")
    return BACKENDS[name]


def backend_of(machine: Target) -> Backend:
    """The backend of the targets of `machine`'s kind."""
    return BACKENDS[machine.kind]
