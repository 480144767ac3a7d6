"""Emit: a plan written as an artifact -- the weights file, the kernels its backend
builds (a shared library, or cubins), and the manifest, whose every kernel entry is a
launch record's (`LaunchRecord.manifest_entry`) with the build's resources attached.

Returns the manifest without its verification record (the verification stage adds it).
"""
from __future__ import annotations

from pathlib import Path

from hidetc import __version__
from hidetc.backends.runtime.artifact import (
    FORMAT_VERSION,
    ArtifactWriter,
    sha256_file,
    utc_now,
)
from hidetc.backends.runtime.weights import write_weights
from hidetc.driver.launch import ExecutionPlan


def write_artifact(writer: ArtifactWriter, plan: ExecutionPlan, ctx, model_path: Path) -> dict:
    """Write `plan`'s weights and kernels under `writer.path` for `ctx` (a
    `CompileContext`); the manifest (see `hidetc.backends.runtime.artifact`)."""
    backend, cfg = ctx.backend, ctx.cfg
    entries = write_weights(writer.path / "weights.bin", plan.weights)
    built = backend.build(plan, entries, writer.path, cfg, ctx.dump("tir"))
    resources = built.pop("resources", {})      # per kernel name
    plan = plan.with_resources(resources)
    graph = plan.graph
    inputs = [_spec(graph, v) for v in graph.inputs]
    outputs = [_spec(graph, v) for v in graph.outputs]
    return {
        "format_version": FORMAT_VERSION,
        "hidetc_version": __version__,
        "target": backend.kind,
        "machine": plan.machine.facts(),
        **backend.manifest_facts(plan.machine),
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
                   **backend.context_memory(plan.memory.arena_bytes, inputs, outputs,
                                            resources)},
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
    return {"name": value, "dtype": t.dtype, "shape": list(t.shape)}
