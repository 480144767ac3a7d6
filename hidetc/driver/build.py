"""Build the CPU library of an execution plan: lower every kernel, print it as C with
its uniform entry wrapper (one translation unit per kernel, so the build cache hits
across models), print the launcher, and let gcc build one shared library.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from hidetc.backends.codegen.c import print_c_module
from hidetc.backends.codegen.c_scratch import heap_scratch_bytes
from hidetc.backends.codegen.launcher import Launch, entry_wrapper, launcher_source
from hidetc.backends.toolchain.gcc import build_shared_library, flags_for
from hidetc.driver.launch import ExecutionPlan
from hidetc.tir.pipeline import lower


def resolve_weight_args(plan: ExecutionPlan, entries: Mapping) -> list[Launch]:
    """Every launch with its weight arguments at their offsets in the weights file."""
    return [record.resolved(entries) for record in plan.launches]


def kernel_sources(plan: ExecutionPlan, dump_dir: str | None = None,
                   more: Sequence[ExecutionPlan] = ()
                   ) -> tuple[dict[str, str], dict[str, dict]]:
    """Each kernel's C translation unit (of `plan` and of the further dispatch variants
    `more`: a kernel name is its content, built once), and its resources:
    `scratch_bytes`, the most it takes from a thread's scratch stack in one call
    (`heap_scratch_bytes`)."""
    sources, resources = {}, {}
    for each in (plan, *more):
        for name, fn in each.functions.items():
            if name in sources:
                continue
            lowered = lower(fn, dump_dir=dump_dir)
            sources[name] = print_c_module([lowered]) + entry_wrapper(lowered)
            resources[name] = {"scratch_bytes": heap_scratch_bytes(lowered)}
    return sources, resources


def launch_table(launches: list[Launch]) -> list[list[list]]:
    """Per launch, its arguments as [space, index] (the manifest's `cpu.launches`: what
    a launch-by-launch run, `CpuExecutor.run_with_hook`, passes each kernel entry)."""
    return [[[a.space, int(a.index)] for a in launch.args] for launch in launches]


def build_cpu_library(plan: ExecutionPlan, entries: Mapping, out_dir: Path,
                      dump_dir: str | None = None, more: Sequence[ExecutionPlan] = ()
                      ) -> tuple[Path, list[list[Launch]], dict[str, dict]]:
    """The library (kernels, their `NAME_entry`, the launcher of `plan` and of each
    dispatch variant in `more`), the launches of each, and the kernels' resources
    (`kernel_sources`)."""
    sources, resources = kernel_sources(plan, dump_dir, more)
    launches = [resolve_weight_args(p, entries) for p in (plan, *more)]
    sources["launcher"] = launcher_source(launches[0], launches[1:])
    src_dir = out_dir / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    for name, text in sources.items():
        (src_dir / f"{name}.c").write_text(text)
    library = build_shared_library(sources, out_dir / "model.so",
                                   opt_flags=flags_for(plan.machine.isa))
    return library, launches, resources
