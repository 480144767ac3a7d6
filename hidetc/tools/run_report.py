"""What `hidetc run` reads, prints and checks: its inputs (a file or seeded random
values), a one-line summary per output, the comparison with ONNX Runtime at the
artifact's own tolerance (errors, then both latencies timed side by side), and the
outputs written atomically."""
from __future__ import annotations

from pathlib import Path

import click
import numpy as np

from hidetc.backends.runtime.sizes import read_dynamic
from hidetc.driver import api
from hidetc.driver.config import TOLERANCES
from hidetc.driver.verify import (
    compare,
    exact_outputs,
    failing,
    load_sample,
    ort_session,
    output_tolerances,
    run_onnxruntime,
    settle,
)
from hidetc.driver.verify_quantized import quantized_outputs, settle_quantized
from hidetc.errors import InputError
from hidetc.frontend.onnx.importer import load_model
from hidetc.tools.bench import alternate


def load_inputs(model: api.Model, path: Path | None, seed: int) -> dict[str, np.ndarray]:
    names = [s["name"] for s in model.inputs]
    if path is not None:
        return load_sample(path, names)
    rng = np.random.default_rng(seed)
    dynamic = read_dynamic(model.manifest)
    shapes, at = {s["name"]: s["shape"] for s in model.inputs}, ""
    if dynamic is not None:     # a range of sizes: each at its largest tuning size
        sizes = {n: r["opt"][-1] for n, r in model.manifest["dynamic"]["symbols"].items()}
        shapes = dynamic.shapes(sizes)
        at = " at " + ", ".join(f"{k}={v}" for k, v in sizes.items())
    click.echo(f"no --input: using random inputs (seed {seed}){at}", err=True)
    out = {}
    for s in model.inputs:
        shape = shapes[s["name"]]
        if s["dtype"].startswith("float"):
            out[s["name"]] = rng.standard_normal(shape).astype(s["dtype"])
        else:
            out[s["name"]] = np.zeros(shape, s["dtype"])
    return out


def describe_array(name: str, a: np.ndarray) -> str:
    head = f"{name}: {a.dtype}{list(a.shape)}"
    if a.size == 0:
        return head + " (empty)"
    if np.issubdtype(a.dtype, np.number):
        f = a.astype(np.float64)
        first = np.array2string(a.reshape(-1)[:4], precision=4, separator=", ")
        return (head + f" mean {f.mean():.4g} std {f.std():.4g} min {f.min():.4g} "
                f"max {f.max():.4g} first {first}")
    return head + f" true {int(np.count_nonzero(a))}/{a.size}"


def compare_with_ort(model_path: Path, model, inputs, outputs, target: str,
                      repeat: int) -> str | None:
    """Errors against ONNX Runtime at the artifact's own tolerance per output (its
    verification record's, else its precision's -- f32 1e-4, f16 1e-2 -- loosened to the
    narrowest float type on each output's path), an output beyond it judged against the
    exact reference as the compile does (`verify.settle`; a quantized model's output by
    its sensitivity, `verify_quantized.settle_quantized`), then both latencies timed side
    by side: the two runtimes alternate in rounds after an idle pause
    (`bench.alternate`), so neither is timed while the other's worker threads still
    spin, and a slow moment of the machine hurts both. Returns the one-line reason when
    an output misses the tolerance (`run --compare` then exits 1), else None."""
    if not model_path.is_file():
        raise InputError(f"{model_path}: no such file")
    reference = run_onnxruntime(model_path, inputs)
    imported: list = []

    def graph():
        if not imported:
            imported.append(load_model(model_path, {name: list(np.shape(a))
                                                    for name, a in inputs.items()}))
        return imported[0]
    rtol = artifact_tolerances(model.manifest) or output_tolerances(
        graph(), artifact_tolerance(model.manifest))
    report = compare(outputs, reference, rtol=rtol)
    if report["status"] != "passed":
        report = settle(report, rtol, outputs, reference,
                        lambda: exact_outputs(graph(), inputs), "onnxruntime")
    if report["status"] != "passed":        # (the compile also checked each kernel)
        settle_quantized(report, rtol if isinstance(rtol, dict) else
                         {n: rtol for n in reference}, outputs, reference,
                         lambda: exact_outputs(graph(), inputs), "onnxruntime",
                         quantized_outputs(graph()))
        report["status"] = "failed" if failing(report, rtol) else "passed"
    for name, entry in report["outputs"].items():
        fields = (f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}"
                  for k, v in entry.items() if k not in ("exact", "passed_by"))
        exact = "".join(f", vs the exact reference: hidetc {e['hidetc']:.3g}, onnxruntime "
                        f"{e['onnxruntime']:.3g}" for e in [entry.get("exact")] if e)
        click.echo(f"vs onnxruntime {name}: " + ", ".join(fields) + exact)
    session = ort_session(model_path)
    feed = dict(inputs)
    timed = alternate({"hidetc": lambda: model.run(inputs),
                       "onnxruntime": lambda: session.run(None, feed)},
                      repeat, rounds=min(5, repeat))
    ours, theirs = timed["hidetc"], timed["onnxruntime"]
    click.echo(f"latency (hidetc, {target}): median {ours['median_ms']:.3f} ms, "
               f"min {ours['min_ms']:.3f} ms over {ours['calls']} runs")
    ratio = ours["median_ms"] / theirs["median_ms"]
    click.echo(f"latency (onnxruntime, cpu): median {theirs['median_ms']:.3f} ms "
               f"-> hidetc/onnxruntime = {ratio:.2f}x (timed alternately)")
    if report["status"] == "passed":
        return None
    bad = [(name, report["outputs"][name]) for name in failing(report, rtol)]
    name, entry = bad[0]
    what = (entry["error"] if "error" in entry else
            f"{entry['mismatches']} mismatched elements" if "mismatches" in entry else
            f"relative error {entry['rel_error']:.3g} > tolerance {rtol[name]:g}")
    return (f"output {name!r} differs from ONNX Runtime's ({what})"
            + (f"; {len(bad) - 1} more output(s) differ" if len(bad) > 1 else ""))


def artifact_tolerances(manifest: dict) -> dict[str, float]:
    """Each output's bound as the artifact's verification recorded it (empty where it
    recorded none: an older hidetc, or no verification)."""
    outputs = (manifest.get("verification") or {}).get("outputs") or {}
    found = {name: float(e["tolerance"]) for name, e in outputs.items()
             if isinstance(e, dict) and isinstance(e.get("tolerance"), (int, float))}
    return found if len(found) == len(manifest["outputs"]) else {}


def artifact_tolerance(manifest: dict) -> float:
    """The norm-wise bound the artifact was verified at (its precision's default when
    the record has none)."""
    recorded = (manifest.get("verification") or {}).get("tolerance")
    if isinstance(recorded, (int, float)):
        return float(recorded)
    return TOLERANCES[manifest.get("precision") or "f32"]


def save_npz(path: Path, outputs) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **outputs)
    tmp.replace(path)
    click.echo(f"wrote {path}")
