"""Build the CUDA side of an execution plan: lower every kernel, print them as CUDA C in
a few translation units, let nvcc build a .cubin per architecture (plus PTX for newer
GPUs), and describe the forward pass as the manifest's `cuda` section (see
`hidetc.backends.runtime.cuda.manifest`).

Kernels are grouped into translation units of at most `KERNELS_PER_UNIT`, by sorted
name, so nvcc runs a few times in parallel and equal units hit the build cache.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from hidetc.backends.codegen.cuda import (
    CUDA_INCLUDE_DIR,
    dynamic_shared_bytes,
    print_cuda_module,
)
from hidetc.backends.toolchain.nvcc import compile_cubins, ptxas_resources
from hidetc.driver.build import resolve_weight_args
from hidetc.driver.launch import ExecutionPlan
from hidetc.graph.symbolic import SymDim
from hidetc.schedules.cuda.cost import kernel_estimate
from hidetc.tir.analysis import at_sizes
from hidetc.tir.pipeline import lower

KERNELS_PER_UNIT = 16


def translation_units(plan: ExecutionPlan, dump_dir: str | None = None,
                      more: Sequence[ExecutionPlan] = ()
                      ) -> tuple[dict[str, str], dict[str, str]]:
    """(unit name -> CUDA source, kernel name -> unit name), over the kernels of `plan`
    and of the further dispatch variants `more` (a kernel name is its content: built
    once)."""
    functions = {n: fn for each in (plan, *more) for n, fn in each.functions.items()}
    names = sorted(functions)
    units, unit_of = {}, {}
    for start in range(0, len(names), KERNELS_PER_UNIT):
        unit = f"unit{start // KERNELS_PER_UNIT}"
        chunk = names[start:start + KERNELS_PER_UNIT]
        units[unit] = print_cuda_module([lower(functions[n], dump_dir=dump_dir)
                                         for n in chunk])
        unit_of.update({n: unit for n in chunk})
    return units, unit_of


def launch_dims(dims) -> list:
    """A launch's grid or block for the manifest: ints, or where the grid depends on the
    symbolic sizes, the expression's text (`hidetc.graph.symbolic.parse` reads it; the
    runtime evaluates it at each pass's sizes)."""
    return [str(d) if isinstance(d, SymDim) else int(d) for d in dims]


def launch_section(plan: ExecutionPlan, entries: Mapping, unit_of: Mapping[str, str]
                   ) -> list[dict]:
    """The manifest's launches of `plan` (`runtime.cuda.manifest`)."""
    launches = []
    for launch in resolve_weight_args(plan, entries):
        fn = plan.functions[launch.kernel]
        launches.append({"kernel": launch.kernel, "module": unit_of[launch.kernel],
                         "grid": launch_dims(fn.attr("grid")),
                         "block": launch_dims(fn.attr("block")),
                         "shared_bytes": dynamic_shared_bytes(fn),
                         "args": [[a.space, a.index] for a in launch.args]})
    return launches


def cuda_section(plan: ExecutionPlan, entries: Mapping, unit_of: Mapping[str, str],
                 modules: list[dict], archs: Sequence[str],
                 more: Sequence[ExecutionPlan] = ()) -> dict:
    section = {"archs": list(archs), "modules": modules,
               "launches": launch_section(plan, entries, unit_of)}
    if more:
        section["variant_launches"] = [launch_section(p, entries, unit_of) for p in more]
    return section


def build_cuda_modules(plan: ExecutionPlan, entries: Mapping, out_dir: Path,
                       archs: Sequence[str], dump_dir: str | None = None,
                       more: Sequence[ExecutionPlan] = (),
                       hints: Sequence[Mapping[str, int]] = ()
                       ) -> tuple[dict, dict[str, dict]]:
    """Write sources and cubins (each with its ptxas report beside it) under `out_dir`
    (the artifact's kernels/ folder); return the manifest's `cuda` section with paths
    relative to out_dir's parent (the launches of each further dispatch variant `more`
    in `variant_launches`), and per kernel its resources (`kernel_resources`)."""
    units, unit_of = translation_units(plan, dump_dir, more)
    src_dir = out_dir / "src"
    src_dir.mkdir(parents=True, exist_ok=True)
    for name, text in units.items():
        (src_dir / f"{name}.cu").write_text(text)
    built = compile_cubins(units, archs, out_dir, include_dirs=(CUDA_INCLUDE_DIR,),
                           keep_logs=True)
    root = out_dir.parent
    modules = []
    for unit in units:
        cubins = {arch: str(built[arch][unit].relative_to(root)) for arch in archs}
        module: dict = {"name": unit, "cubins": cubins}
        ptx = [(key, files[unit]) for key, files in built.items()
               if key.startswith("compute_") and unit in files]
        if ptx:
            module["ptx"] = {"arch": ptx[0][0], "file": str(ptx[0][1].relative_to(root))}
        modules.append(module)
    return (cuda_section(plan, entries, unit_of, modules, archs, more),
            kernel_resources(plan, built, more, hints))


def kernel_resources(plan: ExecutionPlan, built: Mapping[str, Mapping[str, Path]],
                     more: Sequence[ExecutionPlan] = (),
                     hints: Sequence[Mapping[str, int]] = ()) -> dict[str, dict]:
    """Per kernel, from ptxas's report for the plan's arch (the first one built when the
    target's is not among them): `registers` per thread, static `shared_bytes` (the
    launch's dynamic shared memory is the manifest launch's `shared_bytes`),
    `spills` (bytes of spill stores per thread), and the cost model's facts with those
    registers (`hidetc.schedules.cuda.cost`; a dispatch variant's at its `hints` sizes):
    `blocks_per_sm`, the blocks one SM of the target holds at once
    (`CudaTarget.blocks_per_sm`), `waves`, `bytes` and `estimate_us`."""
    machine = plan.machine
    arch = machine.arch if machine.arch in built else next(a for a in built
                                                           if a.startswith("sm_"))
    report: dict[str, dict] = {}
    for cubin in built[arch].values():
        report.update(ptxas_resources(cubin))
    resources = {}
    for each, hint in zip((plan, *more), hints or [None] * (1 + len(more))):
        for name, fn in each.functions.items():
            facts = report.get(name)
            if facts is None or name in resources:
                continue
            shared = facts["shared_bytes"] + dynamic_shared_bytes(fn)   # static + dynamic
            task, fn = each.tasks[name], at_sizes(fn, hint)
            estimate = kernel_estimate(fn, task.at(hint) if hint else task, machine,
                                       facts["registers"], shared)
            resources[name] = {
                "registers": facts["registers"], "shared_bytes": facts["shared_bytes"],
                "spills": facts["spills"], **estimate.facts()}
    return resources

