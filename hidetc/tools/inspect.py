"""Human and JSON descriptions of an artifact's manifest (`hidetc inspect`)."""
from __future__ import annotations

from collections import Counter

from hidetc.driver.dispatch_report import describe as describe_dispatch
from hidetc.graph.guards import Guard


def _spec(s: dict) -> str:
    return f"{s['name']}: {s['dtype']}{list(s['shape'])}"


def precision(manifest: dict) -> str:
    """The artifact's precision (manifests written before `--precision` existed: f32)."""
    return manifest.get("precision") or manifest.get("config", {}).get("precision") or "f32"


def summary_json(manifest: dict) -> dict:
    """The `--json` document: target, kernels (one per launch), verification, and more."""
    return {
        "target": manifest["target"],
        "precision": precision(manifest),
        "hidetc_version": manifest["hidetc_version"],
        "format_version": manifest["format_version"],
        "model": manifest["model"],
        "inputs": manifest["inputs"],
        "outputs": manifest["outputs"],
        "kernels": [{k: v for k, v in kernel.items()} for kernel in manifest["kernels"]],
        "distinct_kernels": len({k["name"] for k in manifest["kernels"]}),
        "memory": {k: v for k, v in manifest["memory"].items() if k != "offsets"},
        "weights_bytes": sum(e["nbytes"] for e in manifest["weights"]["entries"].values()),
        "verification": manifest["verification"],
        "fusion": manifest.get("fusion"),
    }


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KiB"


def context_line(memory: dict) -> str:
    """What each pass in flight holds (`runtime.contexts`): its context's bytes and, on
    the cpu, the scratch stack each running thread keeps."""
    if "context_bytes" not in memory:
        return "per pass in flight: the arena (compiled by an older hidetc)"
    text = f"per pass in flight: {_size(memory['context_bytes'])} (its context"
    if memory.get("io_bytes"):
        text += f": arena and {_size(memory['io_bytes'])} of I/O on the device"
    text += ")"
    scratch = memory.get("scratch_bytes_per_thread", 0)
    if scratch:
        text += f", and up to {_size(scratch)} of scratch per running thread"
    elif "scratch_bytes_per_thread" in memory and scratch is None:
        text += ", and scratch per running thread sized at run time"
    return text


def dynamic_lines(manifest: dict) -> list[str]:
    """A dynamic artifact's ranges, its dispatch variants (where each serves: its
    guards), the dispatch table's measured loss (`driver.dispatch_report`) and the
    memory a pass needs at the ranges' minimum, tuning and maximum sizes."""
    d = manifest.get("dynamic")
    if not d:
        return []
    ranges = "; ".join(f"{n} {r['min']}..{r['max']} (tuning {', '.join(map(str, r['opt']))})"
                       for n, r in d["symbols"].items())
    lines = [f"sizes:   {ranges}; {len(d['variants'])} dispatch variant"
             f"{'s' if len(d['variants']) != 1 else ''}, the first whose guards hold serves:"]
    for k, v in enumerate(d["variants"]):
        where = " and ".join(Guard.parse(g).display() for g in v["guards"]) or "every size"
        hint = ", ".join(f"{n}={x}" for n, x in v["hint"].items())
        lines.append(f"  v{k} ({v['forward']}): {where}; planned at {hint}, "
                     f"{v['kernels']} launches")
    lines += describe_dispatch(d.get("dispatch") or [])
    at = manifest["memory"].get("at_sizes")
    if at:
        lines.append("memory by size (arena + inputs + outputs): " + ", ".join(
            f"{k} {b / 2**20:.2f} MiB" for k, b in at.items()))
    return lines


def describe(manifest: dict) -> str:
    kernels = manifest["kernels"]
    ops = Counter(k["op"] for k in kernels)
    memory = manifest["memory"]
    weights = sum(e["nbytes"] for e in manifest["weights"]["entries"].values())
    lines = [
        f"artifact: hidetc {manifest['hidetc_version']} (format {manifest['format_version']}), "
        f"target {manifest['target']}, precision {precision(manifest)}, "
        f"model {manifest['model']['file']}",
        "inputs:  " + "; ".join(_spec(s) for s in manifest["inputs"]),
        "outputs: " + "; ".join(_spec(s) for s in manifest["outputs"]),
        f"kernels: {len(kernels)} launches, {len({k['name'] for k in kernels})} distinct; "
        + ", ".join(f"{op} x{n}" for op, n in ops.most_common()),
        f"memory:  arena {memory['arena_bytes'] / 2**20:.2f} MiB for "
        f"{memory['total_bytes'] / 2**20:.2f} MiB of intermediates"
        f" ({len(memory.get('in_place', {}))} written in place); "
        f"weights {weights / 2**20:.2f} MiB",
        context_line(memory),
        *dynamic_lines(manifest),
    ]
    v = manifest["verification"]
    line = f"verification: {v.get('status')}"
    if "outputs" in v:
        base = v.get("tolerance")
        errs = ", ".join((f"{name} rel {e['rel_error']:.2e}" + (
            f" (tolerance {e['tolerance']})" if e.get("tolerance", base) != base else ""))
            if "rel_error" in e else f"{name} {e}" for name, e in v["outputs"].items())
        line += (f" vs {v.get('reference')} on {v.get('sample')}: {errs} "
                 f"(tolerance {v.get('tolerance')})")
    lines.append(line)
    fusion = manifest.get("fusion")
    if fusion:
        fused = sum(1 for k in kernels if _members(k))
        lines.append(f"fusion:  {fusion['nodes']} graph nodes in {fusion['groups']} groups "
                     f"({fused} with fused neighbours)"
                     + (f"; {len(fusion['fallbacks'])} fell back: " + "; ".join(
                         f"{f['anchor']} ({f['reason']})" for f in fusion["fallbacks"][:3])
                        if fusion["fallbacks"] else ""))
    estimated = [k["estimate_us"] for k in kernels if "estimate_us" in k]
    if estimated:
        lines.append(f"cost model: {sum(estimated) / 1e3:.3f} ms estimated for "
                     f"{len(estimated)} launches (uncalibrated: hidetc/schedules/cuda/cost.py)")
    lines.append("execution plan (launch, kernel, anchor op + fused ops, node; schedule):")
    for i, k in enumerate(kernels):
        members = _members(k)
        ops_text = k["op"] + (f" [{members}]" if members else "")
        lines.append(f"  {i:4d} {k['name']:<24} {ops_text:<44} {k.get('node', '')}")
        if k.get("template") and k["template"] != "rule":
            lines.append(f"       {'':<24} {k['template']}: {k.get('config')}")
        if "estimate_us" in k:
            lines.append(f"       {'':<24} {k.get('blocks')} blocks, {k.get('blocks_per_sm')} "
                         f"per SM, {k.get('waves')} wave(s), ~{k['estimate_us']:.1f} us")
    return "\n".join(lines)


def _members(kernel: dict) -> str:
    """'Pad > * > Relu, Add': prologue ops, then '*' for the anchor, then epilogue ops;
    ' => Concat' when the result goes straight into its slice of a Concat's output."""
    group = kernel.get("group") or {}
    pro = [op for _, op in group.get("prologues", [])]
    epi = [op for _, op in group.get("epilogues", [])]
    into = f" => {group['into'][1]}" if group.get("into") else ""
    if not pro and not epi and not into:
        return ""
    return " > ".join(([", ".join(pro)] if pro else []) + ["*"] +
                      ([", ".join(epi)] if epi else [])) + into
