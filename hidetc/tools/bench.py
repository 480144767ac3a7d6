"""`hidetc bench`: the benchmark models (or a given model or artifact) compiled for the
available target and timed beside ONNX Runtime on the same inputs, in the same run.

Per subject (a model name from `models`, an .onnx file, or an artifact directory):
compile (tuning as `hidetc compile` would: records reused), check the outputs against
ONNX Runtime, then time both -- warm-up, then rounds that alternate hidetc and the peer
(each round `repeat // rounds` calls of one runner, after an idle pause that lets the
other runtime's spinning worker threads go to sleep: interleaved back to back, ONNX
Runtime's spinning pool took the cores from hidetc's OpenMP threads and doubled its
latency), the reported latency is the median over all calls, so a busy moment hurts
both sides alike; `ratio` is the ratio of those medians, `paired` the median over
rounds of the ratio of each round's fastest calls (`paired_ratio`: steadier when the
machine's speed drifts between rounds). Peak memory: a child process
per runtime loads the model, runs one inference and reports its own peak RSS
(VmHWM: ru_maxrss would include the forking parent's), both children importing the
same libraries. Peers: ONNX
Runtime's CPU provider on the cpu target, its CUDA provider where onnxruntime-gpu is
installed on the cuda target; PyTorch with `--vs torch` (`hidetc.tools.bench_torch`: its
own definitions of the five benchmark models, timed by its own loop); OpenVINO's CPU
plugin with `--vs openvino` (`hidetc.tools.bench_openvino`: the same model file at
OpenVINO's default inference precision, "openvino", and at f32, "openvino_f32", each
timed in the rounds beside hidetc and ONNX Runtime, its precision in
`openvino_precision`). Where ONNX Runtime cannot load or run the model (an op or type it
lacks), hidetc is timed alone and the table says why under the row (`onnxruntime_note`;
`openvino_note` likewise).

Errors: ONNX Runtime's outputs (f32, on the same inputs) are the reference; `check` is
hidetc's verdict against them at the precision's tolerance ("quantized" where that
misses and the compile passed the output by the quantized models' criterion, which
needs the exact reference and each kernel run alone: `hidetc.driver.verify_quantized`),
and `<engine>_error`
(`hidetc_error`, `openvino_error`, ...) each engine's norm-wise relative error,
||y - ref|| / ||ref||, the largest over the outputs (`norm_error`; the table's `err`).
The torch peers have none: their weights are not the model file's.

Ranges of sizes (`--dim seq=1..512`, `--shape ids=1x1..512`: passed to the compile as
`hidetc compile` takes them; a benchmark model name then builds its dynamic variant): a
dynamic artifact is timed at each combination of its symbols' sizes (`--at seq=16,128`,
default each range's minimum, tuning sizes and maximum; `size_points`), one row each
naming its `sizes`, the inputs made as for a static subject with the symbols at those
sizes, ONNX Runtime beside it on the same feeds.

`bench_subject(...)` yields a subject's rows (one for a static artifact);
`hidetc.tools.bench_report` prints them (the table, a `--profile` row's slowest
launches) and draws their chart.
"""
from __future__ import annotations

import inspect
import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Mapping, Optional, Sequence

import numpy as np

from hidetc.backends.runtime.sizes import read_dynamic
from hidetc.errors import ArtifactError, ConfigError, InputError
from hidetc.graph.dims import parse_size
from hidetc.tools.bench_report import row_label

MEMORY_CHILD = r"""
import json, resource, sys
import numpy as np
kind, target, path = sys.argv[1], sys.argv[2], sys.argv[3]
inputs = dict(np.load(sys.argv[4]))
if kind == "hidetc":
    import hidetc
    model = hidetc.load(path)
    model.run(inputs)
else:
    import onnxruntime as ort
    providers = ["CUDAExecutionProvider"] if target == "cuda" else ["CPUExecutionProvider"]
    session = ort.InferenceSession(path, providers=providers)
    session.run(None, inputs)
peak = None
try:  # VmHWM: this process's own peak (ru_maxrss also counts the parent it was forked from)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
except OSError:
    pass
if peak is None:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"peak_rss_mb": peak}))
"""


def _subject(arg: str, work: Path, tiny: bool, ranged: bool = False
             ) -> tuple[str, Optional[Path], Optional[Path]]:
    """(name, onnx path or None, artifact dir or None) of a bench subject; `ranged` (sizes
    bound for the compile): a benchmark model is built with its dynamic axis where its
    builder has one (bert_base "seq", resnet50 "batch")."""
    path = Path(arg)
    if path.is_dir() and (path / "manifest.yaml").is_file():
        from hidetc.backends.runtime.artifact import read_manifest
        model_file = path.parent / read_manifest(path)["model"]["file"]
        return path.name, (model_file if model_file.is_file() else None), path
    if path.suffix == ".onnx" or path.exists():
        if not path.is_file():
            raise InputError(f"{arg}: no such model file")
        return path.stem, path, None
    import models
    if arg not in models.REGISTRY:
        raise InputError(f"{arg}: not a model file, artifact directory or benchmark model "
                         f"(one of {', '.join(sorted(models.REGISTRY))})")
    dynamic = ranged and "dynamic" in inspect.signature(models.REGISTRY[arg]).parameters
    out = work / f"{arg}{'-tiny' if tiny else ''}{'-dynamic' if dynamic else ''}.onnx"
    if not out.is_file():
        models.save(models.build(arg, tiny=tiny, **({"dynamic": True} if dynamic else {})),
                    out)
    return arg, out, None


def _bindings_tag(dims: Optional[Mapping], shapes: Optional[Mapping]) -> str:
    """An artifact directory's suffix naming the compile's size bindings ("" when none),
    so a range's artifact does not replace the static one: "-seq=1..512"."""
    parts = [f"{k}={v}" for k, v in sorted((dims or {}).items())]
    parts += [f"{k}={'x'.join(map(str, v))}" for k, v in sorted((shapes or {}).items())]
    return re.sub(r"[^\w.=,-]", "_", "-" + ",".join(parts)) if parts else ""


def size_points(manifest: dict, at: Optional[Mapping[str, Sequence[int]]],
                subject: str) -> list[dict[str, int]]:
    """The sizes to time an artifact at, one dict (symbol -> size, the manifest's symbol
    order) per row: every combination of, per symbol, the sizes `at` gives, else its
    range's minimum, tuning sizes and maximum (deduplicated). A static artifact: [{}],
    one row without sizes. Raises a one-line InputError for an `at` name that is not a
    symbol of the artifact, or a size outside its symbol's range."""
    section = manifest.get("dynamic") or {}
    symbols = section.get("symbols") or {}
    at = dict(at or {})
    for name in at:
        if name not in symbols:
            known = (f"its symbolic dimensions: {', '.join(symbols)}" if symbols else
                     "a static artifact; compile it with --dim NAME=LO..HI or --shape")
            raise InputError(f"--at {name}: not a symbolic dimension of {subject} ({known})")
    order = [s for s in section.get("order", symbols) if s in symbols]
    choices = []
    for name in order:
        lo, hi = int(symbols[name]["min"]), int(symbols[name]["max"])
        picks = list(dict.fromkeys(at[name])) if name in at else \
            sorted({lo, hi, *(int(o) for o in symbols[name].get("opt") or ())})
        for size in picks:
            if not lo <= size <= hi:
                raise InputError(f"--at {name}={size}: outside the range {lo}..{hi} of "
                                 f"dimension '{name}' of {subject}")
        choices.append(picks)
    return [dict(zip(order, combo)) for combo in itertools.product(*choices)]


def _check_at_ranges(at: Optional[Mapping[str, Sequence[int]]], dims: Optional[Mapping],
                     subject: str) -> None:
    """Before a compile: `at`'s sizes of the dimensions `dims` binds to ranges are inside
    them (the one-line error `size_points` gives after it; it checks the rest)."""
    ranges = {}
    for name, value in (dims or {}).items():
        try:
            rng = parse_size(str(value))
        except ValueError:
            continue            # (the compile's own one-line error)
        if not rng.fixed and name in (at or {}):
            ranges[name] = {"min": rng.lo, "max": rng.hi}
    size_points({"dynamic": {"symbols": ranges}}, {k: at[k] for k in ranges}, subject)


def _input_shapes(model, dynamic, sizes: Mapping[str, int]) -> dict[str, list[int]]:
    """Each artifact input's shape: the manifest's, its symbols (`dynamic`: the
    manifest's read by `read_dynamic`, None for a static artifact) at `sizes`."""
    if dynamic is None:
        return {s["name"]: list(s["shape"]) for s in model.inputs}
    shapes = dynamic.shapes(sizes)
    return {s["name"]: shapes[s["name"]] for s in model.inputs}


def _inputs(model, proto, shapes: Mapping[str, list[int]], seed: int) -> dict[str, np.ndarray]:
    """Seeded inputs of the artifact's input `shapes`. With the model file (`proto`):
    `models.sample_inputs` (token ids within the vocabulary, attention masks), an input
    whose declared dims differ from its shape (symbolic or unknown ones) declared at that
    shape first -- a static file's inputs are left as they are. Else N(0, 1) floats and
    zero integers."""
    if proto is not None:
        import models
        for info in proto.graph.input:
            shape = shapes.get(info.name)
            declared = info.type.tensor_type.shape
            if shape is None or [d.dim_value for d in declared.dim] == list(shape):
                continue
            declared.ClearField("dim")
            for size in shape:
                declared.dim.add().dim_value = int(size)
        return models.sample_inputs(proto, seed)
    rng = np.random.default_rng(seed)
    return {s["name"]: (rng.standard_normal(shapes[s["name"]]).astype(s["dtype"])
                        if s["dtype"].startswith("float")
                        else np.zeros(shapes[s["name"]], s["dtype"]))
            for s in model.inputs}


def _ort_session(onnx_path: Path, target: str):
    import onnxruntime as ort
    if target == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return None, "onnxruntime has no CUDA provider here"
        return ort.InferenceSession(str(onnx_path), providers=["CUDAExecutionProvider"]), None
    return ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]), None


# Before each runner's block: an idle pause, so the other runtime's worker threads (ONNX
# Runtime's spin after each run, OpenMP's after each parallel region) have gone to sleep
# instead of competing for the cores, then one untimed call (the block's own threads
# awake, as in a serving loop).
BLOCK_PAUSE_S = 0.05


def alternate(runners: dict[str, Callable[[], object]], repeat: int, rounds: int = 5,
              warmup: int = 2, pause: float = BLOCK_PAUSE_S) -> dict[str, dict]:
    """Median/min ms per runner, the runners interleaved round by round, each block of
    calls after an idle pause and an untimed call (`BLOCK_PAUSE_S`)."""
    for fn in runners.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in runners}
    best: dict[str, list[float]] = {k: [] for k in runners}     # per round: its fastest call
    per_round = max(1, repeat // rounds)
    for _ in range(rounds):
        for name, fn in runners.items():
            time.sleep(pause)
            fn()
            for _ in range(per_round):
                start = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - start) * 1e3)
            best[name].append(min(times[name][-per_round:]))
    return {k: {"median_ms": float(np.median(v)), "min_ms": float(np.min(v)),
                "calls": len(v), "round_best_ms": best[k]} for k, v in times.items()}


def paired_ratio(a: list[float], b: list[float]) -> float:
    """The median over rounds of a's best call over b's in the same round: on a machine
    whose speed drifts between rounds, steadier than the ratio of medians."""
    return float(np.median(np.asarray(a) / np.asarray(b)))


def peak_memory(kind: str, target: str, path: Path, inputs: dict, work: Path) -> Optional[float]:
    """Peak RSS (MiB) of a child that loads `path` with `kind` and runs one inference."""
    feed = work / "bench-inputs.npz"
    np.savez(feed, **inputs)
    proc = subprocess.run([sys.executable, "-c", MEMORY_CHILD, kind, target, str(path),
                           str(feed)], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_rss_mb"]


def bench_subject(arg: str, work: Path, *, target: str = "auto", precision: str = "f32",
                  repeat: int = 20, tiny: bool = False, memory: bool = True,
                  profile: bool = False, vs_torch: bool = False, vs_openvino: bool = False,
                  at: Optional[Mapping[str, Sequence[int]]] = None,
                  log: Callable[[str], None] = lambda s: None,
                  **compile_options) -> Iterator[dict]:
    """The rows of one subject, each yielded once timed (see the module docstring): one
    for a static artifact, one per `size_points` combination (`at`) for a dynamic one.
    `compile_options` go to the compile (`dims`, `shapes`: sizes or ranges, as
    `hidetc.compile_model` takes them); binding sizes of an artifact directory, an `at`
    name the artifact has no symbol of, or an `at` size outside its range is a one-line
    error, raised before any timing (`vs_openvino` without openvino installed: before
    the compile)."""
    import hidetc
    from hidetc.driver.verify import ort_errors, ort_reason
    if vs_openvino:
        from hidetc.tools.bench_openvino import require
        require()
    bindings = {k: compile_options.get(k) for k in ("dims", "shapes")}
    ranged = any(bindings.values())
    name, onnx_path, artifact = _subject(arg, work, tiny, ranged)
    head: dict = {"model": name, "precision": precision}
    if artifact is not None and ranged:
        raise ConfigError(f"--dim and --shape bind the sizes of a compile; {arg} is an "
                          f"artifact directory (time its own ranges at sizes with --at)")
    if artifact is None:
        _check_at_ranges(at, bindings["dims"], name)
        artifact = work / (f"{name}{'-tiny' if tiny else ''}-{precision}"
                           f"{_bindings_tag(**bindings)}.out")
        log(f"{name}: compiling")
        start = time.perf_counter()
        result = hidetc.compile_model(onnx_path, artifact, target=target, precision=precision,
                                      verify=False, **compile_options)
        head["compile_s"] = time.perf_counter() - start
        head["tune_s"] = result.timings.get("tune_s", 0.0)
    model = hidetc.load(artifact)
    manifest = model.manifest
    points = size_points(manifest, at, name)
    if model.target == "cuda":
        head["cuda_graph"] = model.uses_graph
        if not model.uses_graph:
            head["cuda_graph_unavailable"] = model.graph_unavailable
    head.update(target=model.target, kernels=len(manifest["kernels"]),
                arena_mb=manifest["memory"]["arena_bytes"] / 2**20,
                intermediates_mb=manifest["memory"]["total_bytes"] / 2**20,
                tuning=(manifest.get("tuning") or {}).get("enabled"))
    proto, session, why = None, None, None
    if onnx_path is not None:
        import onnx
        proto = onnx.load(str(onnx_path), load_external_data=False)
        try:
            session, why = _ort_session(onnx_path, model.target)
        except ort_errors() as exc:
            why = f"onnxruntime cannot run this model: {ort_reason(exc)}"
    peers, note = {}, None      # name -> a runner of the model file (.run(inputs) -> outputs)
    if vs_openvino:
        from hidetc.tools.bench_openvino import openvino_peers
        outputs = [o.name for o in proto.graph.output] if proto is not None else ()
        peers, note = openvino_peers(onnx_path, model.target, outputs)
    head.update({"openvino_note": note} if note else {})
    dynamic = read_dynamic(manifest)
    for sizes in points:
        row = ({"model": name, "sizes": sizes} | head) if sizes else dict(head)
        if sizes:       # the dispatch variant serving these sizes, and its launches
            variant = dynamic.choose(sizes).index
            row.update(variant=variant, kernels=manifest["dynamic"]["variants"][variant].get(
                "kernels", row["kernels"]))
        inputs = _inputs(model, proto, _input_shapes(model, dynamic, sizes), seed=1)
        _time_row(row, model, inputs, session, why, onnx_path, repeat, vs_torch, log, peers)
        if memory:
            row["hidetc_peak_mb"] = peak_memory("hidetc", model.target, artifact, inputs, work)
            if "onnxruntime_ms" in row:
                row["onnxruntime_peak_mb"] = peak_memory("onnxruntime", model.target,
                                                         onnx_path, inputs, work)
        if profile:
            try:
                row["profile"] = model.profile(inputs, repeat=max(3, repeat // 2))
            except ArtifactError as exc:    # (a dispatch variant the runtime cannot profile)
                if not sizes:
                    raise
                row["profile_unavailable"] = str(exc)
        yield row


def norm_error(outputs: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]
               ) -> float:
    """The largest over `reference`'s outputs of the norm-wise relative error of
    `outputs`' same-named one, ||y - ref|| / ||ref|| in float64 (integer outputs too;
    where ||ref|| = 0, ||y||). inf for a missing output, a shape that differs, or a
    non-finite value where the reference has another (`float_errors`)."""
    from hidetc.driver.verify import float_errors
    worst = 0.0
    for name, ref in reference.items():
        got = outputs.get(name)
        if got is None or np.shape(got) != np.shape(ref):
            return float("inf")
        worst = max(worst, float_errors(np.asarray(got, np.float64),
                                        np.asarray(ref, np.float64))[0])
    return worst


def _quantized_verdict(manifest: dict) -> bool:
    """Whether the compile passed an output by the quantized models' criterion
    (`hidetc.driver.verify_quantized`), which the bench does not rerun."""
    outputs = manifest.get("verification", {}).get("outputs", {})
    return any("quantized" in str(e.get("passed_by", "")) for e in outputs.values())


def _time_row(row: dict, model, inputs: dict, session, why: Optional[str],
              onnx_path: Optional[Path], repeat: int, vs_torch: bool,
              log: Callable[[str], None], peers: Optional[Mapping] = None) -> None:
    """Fill `row` with one size's check against ONNX Runtime (`session`; None: the row
    says `why`, where the model file is known), each engine's error against its outputs
    (`norm_error`) and the timings of hidetc, ONNX Runtime and `peers` (name -> an object
    whose `.run(inputs)` returns the outputs by name, `.precision` its inference
    precision: `bench_openvino.Peer`) on `inputs`, in the same rounds. `check` is at
    the compile's bound for the precision (`TOLERANCES`)."""
    from hidetc.driver.config import TOLERANCES
    from hidetc.driver.verify import compare, ort_errors, ort_reason
    runners = {"hidetc": lambda: model.run(inputs)}
    reference = None
    if session is not None:
        try:
            reference = dict(zip([o.name for o in session.get_outputs()],
                                 session.run(None, inputs)))
        except ort_errors() as exc:
            session, why = None, f"onnxruntime cannot run this model: {ort_reason(exc)}"
    if onnx_path is not None and session is None:
        row["onnxruntime_note"] = why
    elif session is not None:
        outputs = model.run(inputs)
        row["check"] = compare(outputs, reference, TOLERANCES[row["precision"]])["status"]
        if row["check"] != "passed" and _quantized_verdict(model.manifest):
            row["check"] = "quantized"
        row["hidetc_error"] = norm_error(outputs, reference)
        runners["onnxruntime"] = lambda: session.run(None, inputs)
    for peer_name, peer in (peers or {}).items():
        try:
            got = peer.run(inputs)
        except RuntimeError as exc:     # (OpenVINO's errors; one line in the row)
            from hidetc.tools.bench_openvino import reason
            row[f"{peer_name}_note"] = f"{peer_name} cannot run this model: {reason(exc)}"
            continue
        row[f"{peer_name}_precision"] = peer.precision
        if reference is not None:
            row[f"{peer_name}_error"] = norm_error(got, reference)
        runners[peer_name] = lambda peer=peer: peer.run(inputs)
    log(f"{row_label(row)}: timing ({', '.join(runners)})")
    timed = alternate(runners, repeat)
    row["hidetc_ms"] = timed["hidetc"]["median_ms"]
    for peer_name in list(runners)[1:]:     # onnxruntime, then `peers`
        ms = row[f"{peer_name}_ms"] = timed[peer_name]["median_ms"]
        row[f"ratio_{peer_name}"] = row["hidetc_ms"] / ms
        row[f"ratio_{peer_name}_paired"] = paired_ratio(timed["hidetc"]["round_best_ms"],
                                                        timed[peer_name]["round_best_ms"])
    if vs_torch and onnx_path is not None:
        from hidetc.tools.bench_torch import torch_peers
        for peer, ms in torch_peers(row["model"], model.target, row["precision"], inputs,
                                    repeat).items():
            row[f"{peer}_ms"] = ms
            row[f"ratio_{peer}"] = row["hidetc_ms"] / ms if ms else None
