"""The command line: a thin layer over `hidetc.driver.api`.

Every user-caused error (`HidetcError`) prints one line `hidetc: error: ...` and exits
with code 2; `--debug` shows the traceback instead.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import os
import sys
import time
from pathlib import Path

import click

from hidetc import __version__
from hidetc.backends.runtime.artifact import read_manifest
from hidetc.backends.runtime.emulated import SanitizerError
from hidetc.cpu_isa import current as current_isa
from hidetc.driver import api
from hidetc.driver.backend import BACKENDS
from hidetc.driver.config import CPU_ISAS, LAYOUTS, PRECISIONS
from hidetc.driver.kernel_check import check_kernels
from hidetc.driver.tune.keys import cpu_device
from hidetc.driver.verify import time_call
from hidetc.errors import ConfigError, HidetcError
from hidetc.graph.dims import parse_opt_shape, parse_shape, parse_size, parse_sizes
from hidetc.schedules.catalog import format_spaces, template_spaces
from hidetc.tools.inspect import describe, summary_json
from hidetc.tools.run_report import compare_with_ort, describe_array, load_inputs, save_npz


def _handle_errors(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        debug = click.get_current_context().find_root().params.get("debug", False)
        try:
            return fn(*args, **kwargs)
        except SanitizerError as exc:
            if debug:
                raise
            for hazard in exc.hazards:
                click.echo(f"hidetc: hazard: {hazard}", err=True)
            sys.exit(2)
        except HidetcError as exc:
            if debug:
                raise
            click.echo(f"hidetc: error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("hidetc: interrupted", err=True)
            sys.exit(130)
    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hidetc")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def main(debug: bool) -> None:
    """hidetc: compile ONNX models into verified, fast artifacts."""


@main.command("compile")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(path_type=Path),
              help="Artifact directory to write.")
@click.option("--target", type=click.Choice(["auto", "cpu", "cuda"]), default=None,
              help="Target device (default: auto = cuda when a GPU is visible, else cpu).")
@click.option("--precision", type=click.Choice(list(PRECISIONS)), default=None,
              help="f32 (default), or f16: float16 storage and tensor cores, float32 "
                   "accumulation (cuda target only; verified at 1e-2); bf16 (verified at "
                   "2e-2): on cuda bfloat16 storage and tensor cores, float32 "
                   "accumulation; on the cpu (needs AVX512_BF16) the GEMMs' operands in "
                   "bf16, float32 tensors.")
@click.option("--arch", default=None,
              help="cuda: architectures, e.g. sm_80,sm_90 (default: the visible GPU, else sm_90).")
@click.option("--gpu", default=None,
              help="cuda: compile for this GPU's limits (a100, a10, l4, l40s, rtx4090, "
                   "h100-pcie, h100-sxm, h200); default: the visible GPU, else --arch's.")
@click.option("--cpu-isa", type=click.Choice(list(CPU_ISAS)), default=None,
              help="cpu: the vector ISA of the kernels (default: $HIDETC_CPU_ISA, else "
                   "AVX-512 where the host has it, else AVX2); avx512_bf16: AVX-512 on a "
                   "CPU with AVX512_BF16 (what --precision bf16 needs); amx_bf16: and "
                   "AMX-BF16 (bf16 GEMMs on AMX tiles); the int8 GEMMs of quantized "
                   "models: avx2_vnni (AVX-VNNI), avx512_vnni, amx_int8 (AMX-INT8 tiles; "
                   "with neither, exact AVX2).")
@click.option("--cpu-cores", type=click.IntRange(1), default=None,
              help="cpu: shape the parallel loops for this many cores (a cross-compile "
                   "for another machine; default: the cores this process may use).")
@click.option("--config", "preset", default=None,
              help="A preset in configs/ (by name) or a YAML file.")
@click.option("--sample", type=click.Path(), default=None,
              help="Verify with this .npy/.npz input instead of a seeded random one.")
@click.option("--no-verify", is_flag=True, help="Skip verification against ONNX Runtime.")
@click.option("--no-fuse", is_flag=True,
              help="One kernel per graph node (no prologue/epilogue fusion).")
@click.option("--tune/--no-tune", default=None,
              help="Measure the anchors' schedule candidates on this machine's device "
                   "(default: when the target's device is here).")
@click.option("--space", type=click.IntRange(0, 2), default=None,
              help="Candidates per anchor: 0 the default config, 1 a short list, 2 the "
                   "whole space (default: 2 on cuda, 1 on cpu).")
@click.option("--records", type=click.Path(dir_okay=False), default=None,
              help="The tuning records file (default: records.sqlite in the cache dir).")
@click.option("--layout", type=click.Choice(list(LAYOUTS)), default=None,
              help="auto (default): the target's layout pass (cpu: NHWC convolutions "
                   "with C/G >= 8); nchw: keep the model's NCHW convolutions.")
@click.option("--seed", type=int, default=None, help="Seed of the random verification input.")
@click.option("--shape", "shape_args", multiple=True, metavar="NAME=1x1..512",
              help="Bind the shape of input NAME: per dimension a size or a range of "
                   "sizes (needed where the model leaves a dim symbolic or unknown); "
                   "repeatable.")
@click.option("--dim", "dim_args", multiple=True, metavar="NAME=1..512",
              help="Bind the model's named dimension NAME (every input using it) to a "
                   "size or a range of sizes; repeatable.")
@click.option("--shape-opt", "shape_opt_args", multiple=True, metavar="NAME=1x128",
              help="A shape of input NAME to tune at; repeatable.")
@click.option("--dim-opt", "dim_opt_args", multiple=True, metavar="NAME=16,64,128",
              help="Sizes of the named dimension NAME to tune at (default: a few sizes "
                   "spread over its range); repeatable.")
@_handle_errors
def compile_cmd(model, out_dir, target, precision, arch, gpu, cpu_isa, cpu_cores, preset,
                sample, no_verify, no_fuse, tune, space, records, layout, seed, shape_args,
                dim_args, shape_opt_args, dim_opt_args):
    """Compile MODEL (.onnx) into the artifact directory OUT."""
    overrides = {"target": target, "precision": precision, "arch": arch, "sample": sample,
                 "gpu": gpu, "cpu_cores": cpu_cores, "cpu_isa": cpu_isa,
                 "seed": seed, "verify": False if no_verify else None,
                 "fuse": False if no_fuse else None, "tune": tune, "space": space,
                 "records": records, "layout": layout, "shapes": _parse_shapes(shape_args),
                 "dims": _named_args("--dim", dim_args, "NAME=1..512", parse_size, str),
                 "shape_opts": _parse_shape_opts(shape_opt_args),
                 "dim_opts": _named_args("--dim-opt", dim_opt_args, "NAME=16,64,128",
                                         parse_sizes, list)}
    with _TuneProgress() as progress:
        result = api.compile_model(model, out_dir, preset=preset, progress=progress,
                                   **overrides)
    m = result.manifest
    t = result.timings
    click.echo(f"compiled {model} -> {out_dir} (target {m['target']}, "
               f"precision {m.get('precision', 'f32')}, "
               f"{len(m['kernels'])} kernel launches, "
               f"{len({k['name'] for k in m['kernels']})} distinct kernels)")
    if m.get("machine"):
        click.echo(f"  for: {_machine_line(m['machine'])}")
    if m.get("dynamic"):
        d = m["dynamic"]
        ranges = ", ".join(f"{k} {r['min']}..{r['max']}" for k, r in d["symbols"].items())
        click.echo(f"  sizes: {ranges} ({len(d['variants'])} dispatch variant"
                   f"{'s' if len(d['variants']) != 1 else ''})")
    click.echo(f"  time: frontend+plan {t['frontend_s']:.1f}s, tune {t.get('tune_s', 0):.1f}s, "
               f"build {t['build_s']:.1f}s, verify {t['verify_s']:.1f}s")
    if m.get("tuning"):
        click.echo(_tuning_line(m["tuning"], t.get("tune_s", 0.0)))
    click.echo("  " + _verification_line(m["verification"]))


def _machine_line(facts: dict) -> str:
    """The manifest's `machine` record in a few words."""
    if facts.get("kind") == "cpu":
        return (f"cpu {facts['isa']}, {facts['cores']} cores, L2 {facts['l2_bytes'] // 1024} "
                f"KiB per core")
    return (f"{facts.get('name')} ({facts.get('arch')}, {facts.get('sms')} SMs, "
            f"{facts.get('shared_optin_bytes', 0) // 1024} KiB shared memory per block)")


def _split(flag: str, arg: str, form: str) -> tuple[str, str]:
    name, sep, value = arg.rpartition("=")
    if not sep or not name or not value:
        raise ConfigError(f"{flag} {arg!r}: expected {form}")
    return name, value


def _parse_shapes(args: tuple[str, ...]) -> dict[str, list[int | str]] | None:
    """--shape NAME=1x3x224x224 (or NAME=1,3,224,224; a dim may be a range 1..512),
    repeatable -> {name: dims}."""
    shapes: dict[str, list[int | str]] = {}
    form = "NAME=D0xD1x... with positive dims or ranges, e.g. input=1x3x224x224 or ids=1x1..512"
    for arg in args:
        name, dims = _split("--shape", arg, form)
        try:
            ranges = parse_shape(dims)
        except ValueError:
            raise ConfigError(f"--shape {arg!r}: expected {form}") from None
        if name in shapes:
            raise ConfigError(f"--shape: input {name!r} is given twice")
        shapes[name] = [r.lo if r.fixed else str(r) for r in ranges]
    return shapes or None


def _parse_shape_opts(args: tuple[str, ...]) -> dict[str, list[list[int]]] | None:
    """--shape-opt NAME=1x128, repeatable (several per input) -> {name: [shapes]}."""
    opts: dict[str, list[list[int]]] = {}
    for arg in args:
        name, dims = _split("--shape-opt", arg, "NAME=D0xD1x..., e.g. ids=1x128")
        try:
            opts.setdefault(name, []).append(parse_opt_shape(dims))
        except ValueError as error:
            raise ConfigError(f"--shape-opt {arg!r}: {error}") from None
    return opts or None


def _named_args(flag: str, args: tuple[str, ...], form: str, parse, keep) -> dict | None:
    """FLAG NAME=VALUE, repeatable, once per name -> {name: keep(parse(VALUE))}."""
    found: dict = {}
    for arg in args:
        name, value = _split(flag, arg, form)
        try:
            parsed = parse(value)
        except ValueError as error:
            raise ConfigError(f"{flag} {arg!r}: {error}") from None
        if name in found:
            raise ConfigError(f"{flag}: {name!r} is given twice")
        found[name] = keep(parsed)
    return found or None


class _TuneProgress:
    """A click progress bar over the tuning candidates, opened at the first report
    (nothing is drawn when everything comes from the records)."""

    def __init__(self):
        self.bar = None
        self.done = 0

    def __enter__(self):
        return self

    def __call__(self, label: str, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = click.progressbar(length=total, label="tuning", show_eta=True,
                                         show_pos=True, file=sys.stderr)
            self.bar.__enter__()
        self.bar.label = f"tuning {label}"
        self.bar.update(done - self.done)
        self.done = done

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.__exit__(*exc)
        return False


def _tuning_line(t: dict, seconds: float) -> str:
    if "tasks" not in t:
        return f"  tuning: off ({t.get('reason', 'defaults')})"
    mode = f"space {t['space']}" if t.get("enabled") else "off (defaults and records)"
    failed = f", {t['failures']} dropped" if t.get("failures") else ""
    return (f"  tuning: {mode}; {t['tasks']} anchor signatures, {t['from_records']} from "
            f"records, {t['tuned']} tuned ({t['candidates']} candidates{failed}) in "
            f"{seconds:.1f}s")


def _verification_line(v: dict) -> str:
    if v.get("status") != "passed":
        reason = f" ({v['reason']})" if v.get("reason") else ""
        return f"verification: {v.get('status')}{reason}"
    # the output nearest its own bound (each output's bound follows its path's precision)
    errs = [(o["rel_error"], o.get("tolerance", v["tolerance"]))
            for o in v["outputs"].values() if "rel_error" in o]
    error, bound = max(errs, key=lambda e: e[0] / e[1], default=(None, v["tolerance"]))
    worst = f", max relative error {error:.2e}" if error is not None else ""
    sizes = f" at {len(v['sizes'])} sizes of the ranges" if v.get("sizes") else ""
    return f"verification: passed against {v['reference']}{sizes} ({v['sample']}{worst}, " \
           f"tolerance {bound})"


@main.command("run")
@click.argument("out_dir", type=click.Path(path_type=Path))
@click.option("--input", "input_path", type=click.Path(path_type=Path), default=None,
              help=".npy (single input) or .npz (one array per input name).")
@click.option("--output", "output_path", type=click.Path(path_type=Path), default=None,
              help="Write the outputs to this .npz.")
@click.option("--repeat", type=click.IntRange(1), default=10, show_default=True,
              help="Timed runs (after 2 warm-up runs); the median is reported.")
@click.option("--threads", type=click.IntRange(0), default=0,
              help="CPU threads (0: all cores).")
@click.option("--compare", "compare_model", type=click.Path(path_type=Path),
              default=None, help="Also run this ONNX model in ONNX Runtime: errors and latency.")
@click.option("--emulate", is_flag=True,
              help="Run a cuda artifact on the CPU with the emulator (slow; for testing).")
@click.option("--sanitize", is_flag=True,
              help="With --emulate: report hazards (unwritten outputs, results that depend "
                   "on the order of blocks or threads), one line each, exit 2.")
@click.option("--runtime", type=click.Choice(["python", "c"]), default="python",
              show_default=True,
              help="Execute through this package (python) or the artifact's own C runtime.")
@_handle_errors
def run_cmd(out_dir, input_path, output_path, repeat, threads, compare_model, emulate,
            sanitize, runtime):
    """Run the artifact OUT_DIR on an input and print a summary of the outputs."""
    model = api.load(out_dir, emulate=emulate, sanitize=sanitize, runtime=runtime)
    if threads:
        model.set_threads(threads)
    inputs = load_inputs(model, input_path, 0)
    outputs = model.run(inputs)
    for name, array in outputs.items():
        click.echo(describe_array(name, array))
    target = f"{model.target}, emulated" if emulate else model.target
    if sanitize and compare_model is not None:       # every kernel on the reference's inputs
        hazards = check_kernels(model, compare_model, inputs)
        if hazards:
            raise SanitizerError(hazards)
    if sanitize:
        click.echo("sanitizer: no hazards (every output element written; the same bits "
                   "with blocks and threads in reverse order"
                   + ("; every kernel matches the reference interpreter)"
                      if compare_model is not None else ")"))
    failed = None
    if compare_model is not None:
        failed = compare_with_ort(compare_model, model, inputs, outputs, target, repeat)
    elif not sanitize:                         # (a sanitized run is not a timing)
        stats = time_call(lambda: model.run(inputs), repeat=repeat)
        click.echo(f"latency (hidetc, {target}): median {stats['median_ms']:.3f} ms, "
                   f"min {stats['min_ms']:.3f} ms over {repeat} runs")
    if output_path is not None:
        save_npz(output_path, outputs)
    if failed:
        # which kernel: judged one by one where the launches can run one by one (the
        # cpu executor, the emulator; a sanitized run has judged them already)
        if not sanitize and runtime == "python" and (emulate or model.target == "cpu"):
            hazards = check_kernels(model, compare_model, inputs)
            if hazards:
                failed += f"; the first kernel that differs on exact inputs: " \
                          f"{hazards[0].removeprefix('kernel ')}"
        click.echo(f"hidetc: error: {failed}", err=True)
        sys.exit(1)


@main.command("bench")
@click.argument("subjects", nargs=-1)
@click.option("--target", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
              show_default=True)
@click.option("--precision", type=click.Choice(list(PRECISIONS)), default="f32",
              show_default=True)
@click.option("--repeat", type=click.IntRange(1), default=20, show_default=True,
              help="Timed calls per runner (after warm-up), interleaved in rounds.")
@click.option("--tiny", is_flag=True, help="The tiny variants of the benchmark models.")
@click.option("--vs", "peers", type=click.Choice(["onnxruntime", "torch", "openvino"]),
              multiple=True,
              help="Peers beside ONNX Runtime (always timed when a model file is known): "
                   "torch (PyTorch's own five benchmark models), openvino (OpenVINO's CPU "
                   "plugin on the same model file, at its default inference precision and "
                   "at f32; pip install 'hidetc[openvino]'); repeatable.")
@click.option("--profile", is_flag=True,
              help="Per-kernel times (cpu: the launcher's clock; cuda: CUDA events per launch).")
@click.option("--no-memory", is_flag=True, help="Skip the peak-memory child processes.")
@click.option("--work", type=click.Path(file_okay=False, path_type=Path),
              default=Path("bench-work"), show_default=True,
              help="Where models and artifacts are written (reused between runs).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="Write the rows and machine facts as JSON.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="A bar chart of latency per model and system (matplotlib).")
@click.option("--tune/--no-tune", default=None, help="As for compile (default: auto).")
@click.option("--shape", "shape_args", multiple=True, metavar="NAME=1x1..512",
              help="As for compile: bind input NAME's dims to sizes or ranges; repeatable.")
@click.option("--dim", "dim_args", multiple=True, metavar="NAME=1..512",
              help="As for compile: bind the model's named dimension NAME to a size or a "
                   "range; repeatable.")
@click.option("--at", "at_args", multiple=True, metavar="NAME=16,128",
              help="Sizes of the symbolic dimension NAME to time a range's artifact at, "
                   "one row per combination (default: each range's min, tuning sizes and "
                   "max); repeatable.")
@_handle_errors
def bench_cmd(subjects, target, precision, repeat, tiny, peers, profile, no_memory, work,
              json_path, plot_path, tune, shape_args, dim_args, at_args):
    """Time models beside ONNX Runtime (and PyTorch with --vs torch, OpenVINO with --vs
    openvino). SUBJECTS: benchmark model names (default: the five), .onnx files or artifact
    directories. An artifact for ranges of sizes (--dim/--shape, or a directory compiled
    so) gets a row per size. err: each engine's norm-wise relative error against ONNX
    Runtime's outputs (the largest over the outputs)."""
    import platform

    import models
    from hidetc.tools.bench import bench_subject, format_table, plot, profile_lines
    sizes = {"shapes": _parse_shapes(shape_args),
             "dims": _named_args("--dim", dim_args, "NAME=1..512", parse_size, str)}
    at = _named_args("--at", at_args, "NAME=16,128", parse_sizes, list)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    click.echo(format_table([]))
    for subject in subjects or sorted(models.REGISTRY):
        for row in bench_subject(subject, work, target=target, precision=precision,
                                 repeat=repeat, tiny=tiny, memory=not no_memory,
                                 profile=profile, vs_torch="torch" in peers,
                                 vs_openvino="openvino" in peers, at=at, tune=tune,
                                 log=lambda m: click.echo(m, err=True), **sizes):
            rows.append(row)
            click.echo("\n".join(format_table([row]).splitlines()[1:]))
    if profile:
        for row in rows:
            click.echo("\n".join(profile_lines(row)))
    if json_path:
        doc = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": platform.processor() or platform.machine(),
               "cpu": cpu_device().removeprefix("cpu:"), "cpu_isa": current_isa().name,
               "onnxruntime": _version("onnxruntime"),
               **({"openvino": _version("openvino")} if "openvino" in peers else {}),
               "cores": os.cpu_count(), "hidetc": __version__, "repeat": repeat,
               "rows": rows}
        json_path.write_text(json.dumps(doc, indent=2) + "\n")
        click.echo(f"wrote {json_path}")
    if plot_path:
        plot(rows, plot_path)
        click.echo(f"wrote {plot_path}")


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@main.command("inspect")
@click.argument("out_dir", type=click.Path(path_type=Path), required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--space", is_flag=True,
              help="List every schedule template and the size of its space (per target "
                   "and precision) instead of describing an artifact.")
@click.option("--target", type=click.Choice(list(BACKENDS)), default=None,
              help="With --space: only this target's templates.")
@click.option("--arch", default=None, help="With --space: the CUDA architecture (sm_90).")
@_handle_errors
def inspect_cmd(out_dir, as_json, space, target, arch):
    """Describe the artifact OUT_DIR: graph, kernels, fusion groups, memory,
    verification; or, with --space, the schedule templates' spaces."""
    if space:
        kinds = (target,) if target else tuple(BACKENDS)
        rows = template_spaces([BACKENDS[k].space_set(arch) for k in kinds])
        if as_json:
            click.echo(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))
        else:
            click.echo(format_spaces(rows))
        return
    if out_dir is None:
        raise click.UsageError("give an artifact directory OUT_DIR, or --space")
    manifest = read_manifest(out_dir)
    if as_json:
        click.echo(json.dumps(summary_json(manifest), indent=2))
    else:
        click.echo(describe(manifest))


@main.group("records")
def records_group() -> None:
    """Tuning records: list, export and import (records tuned on a GPU machine let a
    GPU-less one compile with the same winners)."""


_RECORDS_OPTION = click.option(
    "--records", "records_path", type=click.Path(path_type=Path), default=None,
    help="The records store (default: records.sqlite in the cache directory, "
         "$HIDETC_CACHE_DIR or ~/.cache/hidetc).")


def _store_path(records_path: Path | None) -> Path:
    from hidetc.driver.tune.records import RecordStore
    return Path(records_path) if records_path else RecordStore.default_path()


@records_group.command("list")
@_RECORDS_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@_handle_errors
def records_list_cmd(records_path, as_json):
    """List the records: one line per anchor task and machine."""
    from hidetc.driver.tune.records import RecordStore
    path = _store_path(records_path)
    if not path.exists():
        entries = []
    else:
        with RecordStore(path, create=False) as store:
            entries = store.entries()
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    click.echo(f"{len(entries)} records in {path}")
    for e in entries:
        time = f"{e['time_ms']:.4g} ms" if e["time_ms"] is not None else "-"
        click.echo(f"{e['template']}  {e['signature']}\n"
                   f"    {e['device']} {e['arch']} ({e['toolchain']}, hidetc {e['hidetc']}): "
                   f"winner {e['winner'] or 'none'} {time}; "
                   f"{e['measured']} measured, {e['failed']} failed")


@records_group.command("export")
@click.argument("file", type=click.Path(path_type=Path))
@_RECORDS_OPTION
@_handle_errors
def records_export_cmd(file, records_path):
    """Write every record to FILE (JSON Lines)."""
    from hidetc.driver.tune.records import RecordStore
    with RecordStore(_store_path(records_path), create=False) as store:
        count = store.export(file)
    click.echo(f"exported {count} records from {store.path} to {file}")


@records_group.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@_RECORDS_OPTION
@_handle_errors
def records_import_cmd(file, records_path):
    """Merge the records of FILE (from `hidetc records export`) into the store; they
    replace records with the same key."""
    from hidetc.driver.tune.records import RecordStore
    with RecordStore(_store_path(records_path)) as store:
        count = store.import_file(file)
    click.echo(f"imported {count} records from {file} into {store.path}")


if __name__ == "__main__":
    main()
