"""The command line: a thin layer over `hidetc.driver.api`.

Every user-caused error (`HidetcError`) prints one line `hidetc: error: ...` and exits
with code 2; `--debug` shows the traceback instead (`cli_errors.handle_errors`). The
group `main` and the small commands live here; `compile` in `compile_cli`, `farm` (many
compiles, locally or on a Ray cluster) in `farm`.
"""
from __future__ import annotations

import dataclasses
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
from hidetc.driver.config import PRECISIONS
from hidetc.driver.kernel_check import check_kernels
from hidetc.driver.tune.keys import cpu_device
from hidetc.driver.verify import time_call
from hidetc.graph.dims import parse_size, parse_sizes
from hidetc.schedules.catalog import format_spaces, template_spaces
from hidetc.tools.cli_errors import handle_errors
from hidetc.tools.compile_cli import compile_cmd, named_args, parse_shapes
from hidetc.tools.farm import farm_group
from hidetc.tools.inspect import describe, summary_json
from hidetc.tools.run_report import compare_with_ort, describe_array, load_inputs, save_npz


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hidetc")
@click.option("--debug", is_flag=True, help="Show tracebacks for errors.")
def main(debug: bool) -> None:
    """hidetc: compile ONNX models into verified, fast artifacts."""


main.add_command(compile_cmd)
main.add_command(farm_group)


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
@handle_errors
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
@handle_errors
def bench_cmd(subjects, target, precision, repeat, tiny, peers, profile, no_memory, work,
              json_path, plot_path, tune, shape_args, dim_args, at_args):
    """Time models beside ONNX Runtime (and PyTorch with --vs torch, OpenVINO with --vs
    openvino). SUBJECTS: benchmark model names (default: the five), .onnx files or artifact
    directories. An artifact for ranges of sizes (--dim/--shape, or a directory compiled
    so) gets a row per size. err: each engine's norm-wise relative error against ONNX
    Runtime's outputs (the largest over the outputs)."""
    import platform

    import models
    from hidetc.tools.bench import bench_subject
    from hidetc.tools.bench_report import format_table, plot, profile_lines
    sizes = {"shapes": parse_shapes(shape_args),
             "dims": named_args("--dim", dim_args, "NAME=1..512", parse_size, str)}
    at = named_args("--at", at_args, "NAME=16,128", parse_sizes, list)
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
@handle_errors
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
@handle_errors
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
@handle_errors
def records_export_cmd(file, records_path):
    """Write every record to FILE (JSON Lines)."""
    from hidetc.driver.tune.records import RecordStore
    with RecordStore(_store_path(records_path), create=False) as store:
        count = store.export(file)
    click.echo(f"exported {count} records from {store.path} to {file}")


@records_group.command("import")
@click.argument("file", type=click.Path(path_type=Path))
@_RECORDS_OPTION
@handle_errors
def records_import_cmd(file, records_path):
    """Merge the records of FILE (from `hidetc records export`) into the store; they
    replace records with the same key."""
    from hidetc.driver.tune.records import RecordStore
    with RecordStore(_store_path(records_path)) as store:
        count = store.import_file(file)
    click.echo(f"imported {count} records from {file} into {store.path}")


if __name__ == "__main__":
    main()
