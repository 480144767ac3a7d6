"""Emit: a plan written as an artifact -- the weights file, the kernels its backend
builds (a shared library, or cubins), and the manifest, whose every kernel entry is a
launch record's (`LaunchRecord.manifest_entry`) with the build's resources attached.

Returns the manifest without its verification record (the verification stage adds it).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from hidetc import __version__
from hidetc.backends.codegen.launcher import forward_name
from hidetc.backends.runtime.artifact import (
    FORMAT_VERSION,
    ArtifactWriter,
    sha256_file,
    utc_now,
)
from hidetc.backends.runtime.c_build import install_runtime
from hidetc.backends.runtime.plan_file import ABI_VERSION as PLAN_ABI
from hidetc.backends.runtime.plan_file import write_plan
from hidetc.backends.runtime.weights import write_weights
from hidetc.driver.dynamic import Variant
from hidetc.driver.launch import ExecutionPlan
from hidetc.graph.ir import Graph
from hidetc.graph.symbolic import SymDim


def write_artifact(writer: ArtifactWriter, plan: ExecutionPlan, ctx, model_path: Path,
                   variants: Sequence[Variant] = (), symbolic: Optional[Graph] = None
                   ) -> dict:
    """Write `plan`'s weights and kernels under `writer.path` for `ctx` (a
    `CompileContext`); the manifest (see `hidetc.backends.runtime.artifact`). A compile
    for ranges of sizes passes its dispatch `variants` (`plan` is the first's): their
    weights share one file, their kernels one library, each variant a launcher, and
    the manifest's `dynamic` section says which sizes each serves (the inputs and
    outputs as the `symbolic` graph types them: a variant may be a static build)."""
    backend, cfg = ctx.backend, ctx.cfg
    entries = write_weights(writer.path / "weights.bin", _weights(plan, variants))
    built = backend.build(plan, entries, writer.path, cfg, ctx.dump("tir"),
                          **({"more": [v.plan for v in variants[1:]],
                              "hints": [dict(v.hint) for v in variants]} if variants else {}))
    resources = built.pop("resources", {})      # per kernel name
    plan = plan.with_resources(resources)
    graph = symbolic if symbolic is not None else plan.graph
    inputs = [_spec(graph, v) for v in graph.inputs]
    outputs = [_spec(graph, v) for v in graph.outputs]
    # what a context stages: the inputs and outputs at the ranges' largest sizes
    largest = graph.at({s: r.hi for s, r in graph.symbols.items()}) if graph.symbols else graph
    staged = ([_spec(largest, v) for v in graph.inputs],
              [_spec(largest, v) for v in graph.outputs])
    manifest = _manifest(plan, ctx, model_path, entries, built, resources, inputs, outputs,
                         staged)
    if variants:
        arena = max(int(v.plan.memory.arena_bytes) for v in variants)
        manifest["memory"]["arena_bytes"] = arena
        manifest["memory"].update(backend.context_memory(arena, *staged, resources))
        manifest["memory"]["at_sizes"] = _bytes_at_sizes(graph, manifest["memory"]
                                                         ["arena_bytes"])
        manifest["dynamic"] = {
            "symbols": {s: r.as_dict() for s, r in graph.symbols.items()},
            "order": sorted(graph.symbols),
            "graph_cache": int(cfg.graph_cache),
            "variants": [v.as_dict(forward_name(k), first=k == 0)
                         for k, v in enumerate(variants)]}
    return _with_c_runtime(writer.path, plain(manifest))


def _with_c_runtime(root: Path, manifest: dict) -> dict:
    """The manifest with its `runtime` section: the C runtime installed in `root`
    (`c_build`) and the plan it executes written beside the manifest (`plan_file`)."""
    runtime = install_runtime(root)
    runtime["abi"] = PLAN_ABI
    runtime["plan"] = write_plan(root, manifest).name
    return {**manifest, "runtime": runtime}


def _bytes_at_sizes(graph, arena: int) -> dict:
    """What one pass holds at the ranges' minimum, middle tuning size and maximum: the
    arena (sized once, at the maximum) and the inputs and outputs at those sizes."""
    picks = {"min": {s: r.lo for s, r in graph.symbols.items()},
             "opt": {s: r.opts[len(r.opts) // 2] for s, r in graph.symbols.items()},
             "max": {s: r.hi for s, r in graph.symbols.items()}}
    io = (*graph.inputs, *graph.outputs)
    return {k: int(arena) + sum(int(graph.types[v].at(sizes).nbytes) for v in io)
            for k, sizes in picks.items()}


def _weights(plan: ExecutionPlan, variants: Sequence[Variant]) -> dict:
    """The weights of the plan and of every variant (one copy of each name)."""
    weights = dict(plan.weights)
    for variant in variants:
        for name, array in variant.plan.weights.items():
            if name not in weights:
                weights[name] = array
            elif not np.array_equal(np.asarray(weights[name]), np.asarray(array)):
                raise ValueError(f"two dispatch variants hold different weights "
                                 f"named {name!r}")
    return weights


def plain(value):
    """The manifest with symbolic sizes as their texts (YAML writes no SymDim)."""
    if isinstance(value, SymDim):
        return str(value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def _manifest(plan: ExecutionPlan, ctx, model_path: Path, entries, built: dict,
              resources: dict, inputs: list, outputs: list, staged: tuple) -> dict:
    backend, cfg, graph = ctx.backend, ctx.cfg, plan.graph
    return {
        "format_version": FORMAT_VERSION,
        "hidetc_version": __version__,
        "target": backend.kind,
        "machine": plan.machine.facts(),
        **backend.manifest_facts(plan.machine, cfg.precision,
                                 {r.op for r in plan.launches}),
        "precision": cfg.precision,
        "created": utc_now(),
        "model": {"file": model_path.name, "sha256": sha256_file(model_path)},
        "inputs": inputs,
        "outputs": outputs,
        "output_sources": plan.output_sources,
        "kernels": [r.manifest_entry(graph) for r in plan.launches],
        "fusion": {"groups": len(plan.launches), "nodes": len(graph.nodes),
                   "fallbacks": plan.fusion_fallbacks},
        "memory": {"arena_bytes": plan.memory.arena_bytes,
                   "total_bytes": plan.memory.total_bytes,
                   "offsets": dict(plan.memory.offsets),
                   "in_place": dict(plan.in_place),
                   # each arena value's size (the kept-zero region's too: `scratch`'s
                   # ZEROED_REGION, split-K's arrival counters)
                   "bytes": dict(plan.value_bytes),
                   # the graph values' element types (the sanitizer's poison check)
                   "dtypes": {v: graph.types[v].dtype for v in plan.value_bytes
                              if v in graph.types},
                   # what each execution context (a pass in flight) holds
                   **backend.context_memory(plan.memory.arena_bytes, *staged, resources)},
        "weights": {"file": "weights.bin",
                    "entries": {k: _entry_dict(e) for k, e in entries.items()}},
        **built,
        "config": cfg.as_dict(),
    }


def _entry_dict(entry) -> dict:
    return {"offset": int(entry.offset), "nbytes": int(entry.nbytes), "dtype": str(entry.dtype),
            "shape": [int(d) for d in entry.shape]}


def _spec(graph, value: str) -> dict:
    t = graph.types[value]
    return {"name": value, "dtype": t.dtype,
            "shape": [d if isinstance(d, int) else str(d) for d in t.shape]}
