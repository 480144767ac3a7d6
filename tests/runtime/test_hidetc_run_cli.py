"""hidetc-run, the artifact's command-line runner (OUT/bin/hidetc-run, built from
runtime/c/hidetc_run.c, run_io.c, run_threads.c and npy.c on the C runtime alone): its
.npy outputs are the bytes np.save writes for `hidetc.load(OUT).run(...)`'s outputs
(bfloat16 as numpy writes an ml_dtypes array: descr '<V2'), on static and dynamic
artifacts; --repeat and --threads time the passes and check every thread's outputs
against thread 0's; a bad input, name or artifact is one `hidetc-run: error:` line and a
non-zero exit (2: usage, 1: runtime); no Python is mapped; the ASan+UBSan build runs the
same paths clean."""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import hidetc

TIMEOUT = 120
_C = numpy_helper.from_array(np.linspace(-1, 1, 8).astype(np.float32), "c")


def _static_model() -> onnx.ModelProto:
    """x f32[2,8], k i32[2,8], xb bf16[3] -> six outputs of five dtypes, one named with
    a '/' (written as out_idx.npy)."""
    nodes = [helper.make_node("Add", ["x", "c"], ["t"]),
             helper.make_node("Tanh", ["t"], ["y"]),
             helper.make_node("ArgMax", ["x"], ["out/idx"], axis=1, keepdims=0),
             helper.make_node("Cast", ["y"], ["y_bf16"], to=T.BFLOAT16),
             helper.make_node("Add", ["k", "k"], ["k2"]),
             helper.make_node("Cast", ["xb"], ["xbf"], to=T.FLOAT),
             helper.make_node("Mul", ["xbf", "xbf"], ["z"]),
             helper.make_node("Greater", ["x", "c"], ["flag"])]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [2, 8]),
         helper.make_tensor_value_info("k", T.INT32, [2, 8]),
         helper.make_tensor_value_info("xb", T.BFLOAT16, [3])],
        [helper.make_tensor_value_info("y", T.FLOAT, [2, 8]),
         helper.make_tensor_value_info("out/idx", T.INT64, [2]),
         helper.make_tensor_value_info("y_bf16", T.BFLOAT16, [2, 8]),
         helper.make_tensor_value_info("k2", T.INT32, [2, 8]),
         helper.make_tensor_value_info("z", T.FLOAT, [3]),
         helper.make_tensor_value_info("flag", T.BOOL, [2, 8])], [_C])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _dynamic_model() -> onnx.ModelProto:
    """x f32[S,8] -> y = tanh(x + c) [S,8], s = y.sum(1) [S]."""
    nodes = [helper.make_node("Add", ["x", "c"], ["t"]),
             helper.make_node("Tanh", ["t"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["s"], axes=[1], keepdims=0)]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, ["S", 8])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["S", 8]),
         helper.make_tensor_value_info("s", T.FLOAT, ["S"])], [_C])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])
    model.ir_version = 8
    return model


def _compile(tmp: Path, model: onnx.ModelProto, **options) -> Path:
    tmp.mkdir(parents=True, exist_ok=True)
    onnx.save(model, tmp / "m.onnx")
    # verify=False: onnxruntime takes no bfloat16 inputs; the Python runtime is the
    # reference here
    hidetc.compile_model(tmp / "m.onnx", tmp / "out", target="cpu", verify=False, **options)
    out = tmp / "out"
    assert (out / "bin" / "hidetc-run").is_file()
    return out


@pytest.fixture(scope="module")
def static_out(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("static"), _static_model())


@pytest.fixture(scope="module")
def dynamic_out(tmp_path_factory) -> Path:
    return _compile(tmp_path_factory.mktemp("dynamic"), _dynamic_model(), dims={"S": "1..32"})


def _feeds(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((2, 8)).astype(np.float32),
            "k": rng.integers(-100, 100, (2, 8)).astype(np.int32),
            "xb": np.array([1.5, -2.0, 3.25], ml_dtypes.bfloat16)}


def _save(tmp: Path, feeds: dict) -> list[str]:
    """The arrays as tmp/NAME.npy; the --input arguments."""
    args = []
    for name, array in feeds.items():
        path = tmp / f"{name}.npy"
        np.save(path, array)
        args += ["--input", f"{name}={path}"]
    return args


def _run(out: Path, *args, runner: Path | None = None, env: dict | None = None):
    runner = runner or out / "bin" / "hidetc-run"
    return subprocess.run([str(runner), str(out), *map(str, args)], capture_output=True,
                          text=True, timeout=TIMEOUT, env={**os.environ, **(env or {})})


def _npy_bytes(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


def _assert_outputs(out_dir: Path, expected: dict, files: dict | None = None) -> None:
    """Every output file holds what np.save writes for the Python runtime's output."""
    files = files or {}
    for name, want in expected.items():
        path = out_dir / files.get(name, f"{name}.npy")
        got = np.load(path)
        if want.dtype == ml_dtypes.bfloat16:
            assert got.dtype == np.dtype("V2")
            got = got.view(ml_dtypes.bfloat16)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), name
        assert path.read_bytes() == _npy_bytes(want), name


def _assert_one_line_error(proc, *fragments, code: int | None = None) -> str:
    assert proc.returncode != 0, proc.stdout
    if code is not None:
        assert proc.returncode == code, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("hidetc-run: error: "), lines[0]
    assert "Traceback" not in proc.stderr and "Sanitizer" not in proc.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_outputs_are_the_python_runtimes_as_numpy_saves_them(static_out, tmp_path):
    feeds = _feeds()
    expected = hidetc.load(static_out).run(feeds)
    out_dir = tmp_path / "results" / "nested"          # created, parents too
    proc = _run(static_out, *_save(tmp_path, feeds), "--output-dir", out_dir)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    _assert_outputs(out_dir, expected, {"out/idx": "out_idx.npy"})
    # one file per output, no temporaries left
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(
        ["y.npy", "out_idx.npy", "y_bf16.npy", "k2.npy", "z.npy", "flag.npy"])
    assert "output out/idx: int64 (2,) -> " in proc.stdout
    # a second run replaces the files
    feeds = _feeds(1)
    expected = hidetc.load(static_out).run(feeds)
    proc = _run(static_out, *_save(tmp_path, feeds), "--output-dir", out_dir, "--quiet")
    assert proc.returncode == 0 and proc.stdout == "" and proc.stderr == ""
    _assert_outputs(out_dir, expected, {"out/idx": "out_idx.npy"})


def test_bfloat16_is_written_as_numpy_writes_ml_dtypes_arrays(static_out, tmp_path):
    feeds = _feeds()
    proc = _run(static_out, *_save(tmp_path, feeds), "--output-dir", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    raw = (tmp_path / "o" / "y_bf16.npy").read_bytes()
    assert b"'descr': '<V2'" in raw[:128]
    want = hidetc.load(static_out).run(feeds)["y_bf16"]
    assert np.array_equal(np.load(tmp_path / "o" / "y_bf16.npy").view(ml_dtypes.bfloat16), want)
    # the bfloat16 input went in as its raw values: z = float(xb)**2
    assert np.array_equal(np.load(tmp_path / "o" / "z.npy"),
                          feeds["xb"].astype(np.float32) ** 2)


def test_repeat_prints_the_median(static_out, tmp_path):
    proc = _run(static_out, *_save(tmp_path, _feeds()), "--repeat", "5", "--quiet")
    assert proc.returncode == 0, proc.stderr
    match = re.fullmatch(r"median_ms=([0-9.]+) min_ms=([0-9.]+) runs=5 threads=1\n",
                         proc.stdout)
    assert match, proc.stdout
    assert 0 <= float(match[2]) <= float(match[1])


def test_threads_agree_and_print_throughput(static_out, tmp_path):
    feeds = _feeds(2)
    expected = hidetc.load(static_out).run(feeds)
    proc = _run(static_out, *_save(tmp_path, feeds), "--threads", "4", "--repeat", "3",
                "--warmup", "2", "--output-dir", tmp_path / "o", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"median_ms=[0-9.]+ min_ms=[0-9.]+ runs=3 threads=4 "
                        r"throughput=[0-9.]+\n", proc.stdout), proc.stdout
    _assert_outputs(tmp_path / "o", expected, {"out/idx": "out_idx.npy"})
    # OMP_NUM_THREADS set: the contexts follow it
    proc = _run(static_out, *_save(tmp_path, feeds), "--threads", "2", "--quiet",
                env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0 and "threads=2 throughput=" in proc.stdout, proc.stderr


def _bad(tmp: Path, case: str) -> tuple[list[str], int, tuple[str, ...]]:
    """(the --input arguments, the exit code, fragments of the error line)"""
    feeds = _feeds()
    if case == "dtype":
        feeds["x"] = feeds["x"].astype(np.float64)
        return _save(tmp, feeds), 1, ("input x", "float64", "expects float32")
    if case == "bf16 as float32":
        feeds["xb"] = feeds["xb"].astype(np.float32)
        return _save(tmp, feeds), 1, ("input xb", "expects bfloat16", "'<V2'")
    if case == "shape":
        feeds["x"] = np.zeros((2, 9), np.float32)
        return _save(tmp, feeds), 1, ("input x", "(2, 9)", "(2, 8)")
    if case == "rank":
        feeds["k"] = np.zeros(16, np.int32)
        return _save(tmp, feeds), 1, ("input k", "(16,)", "(2, 8)")
    if case == "fortran":
        feeds["x"] = np.asfortranarray(feeds["x"])
        return _save(tmp, feeds), 1, ("input x", "Fortran order")
    if case == "missing":
        del feeds["k"], feeds["xb"]
        return _save(tmp, feeds), 2, ("missing inputs", "k (int32 (2, 8))",
                                      "xb (bfloat16 (3,))")
    if case == "unknown":
        return _save(tmp, feeds) + ["--input", f"q={tmp / 'x.npy'}"], 2, ("unknown input 'q'",
                                                                          "'x', 'k', 'xb'")
    if case == "twice":
        return _save(tmp, feeds) + ["--input", f"x={tmp / 'x.npy'}"], 2, ("'x' given twice",)
    if case == "not npy":
        args = _save(tmp, feeds)
        (tmp / "x.npy").write_text("x,y\n1,2\n")
        return args, 1, ("input x", "not a .npy file")
    if case == "truncated":
        args = _save(tmp, feeds)
        path = tmp / "k.npy"
        path.write_bytes(path.read_bytes()[:-5])
        return args, 1, ("input k", "truncated")
    if case == "no file":
        args = _save(tmp, feeds)
        (tmp / "xb.npy").unlink()
        return args, 1, ("input xb", "No such file")
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["dtype", "bf16 as float32", "shape", "rank", "fortran",
                                  "missing", "unknown", "twice", "not npy", "truncated",
                                  "no file"])
def test_bad_inputs_are_one_line_errors(static_out, tmp_path, case):
    args, code, fragments = _bad(tmp_path, case)
    proc = _run(static_out, *args, "--output-dir", tmp_path / "o")
    _assert_one_line_error(proc, *fragments, code=code)
    assert proc.stdout == ""
    assert not (tmp_path / "o").exists()       # nothing written on a failed run


def test_usage_errors(static_out, tmp_path):
    runner = static_out / "bin" / "hidetc-run"
    proc = subprocess.run([str(runner), "--help"], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: hidetc-run OUT")
    proc = subprocess.run([str(runner)], capture_output=True, text=True, timeout=TIMEOUT)
    _assert_one_line_error(proc, "no artifact directory", code=2)
    for args, fragment in ((["--repeat", "0"], "--repeat"), (["--threads", "x"], "--threads"),
                           (["--bogus"], "unknown option '--bogus'"),
                           (["--input", "x.npy"], "NAME=FILE"), (["--repeat"], "needs a value"),
                           ([str(tmp_path)], "unexpected argument")):
        _assert_one_line_error(_run(static_out, *args), fragment, code=2)


def test_a_bad_artifact_is_a_runtime_error(static_out, tmp_path):
    args = _save(tmp_path, _feeds())
    proc = _run(static_out, *args, runner=static_out / "bin" / "hidetc-run")
    assert proc.returncode == 0
    broken = tmp_path / "broken"
    shutil.copytree(static_out, broken)
    weights = broken / "weights.bin"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    proc = _run(broken, *args, runner=static_out / "bin" / "hidetc-run")
    _assert_one_line_error(proc, "checksum: ", code=1)
    proc = _run(tmp_path / "nowhere", *args, runner=static_out / "bin" / "hidetc-run")
    _assert_one_line_error(proc, code=1)


def test_dynamic_artifact_at_two_lengths(dynamic_out, tmp_path):
    model = hidetc.load(dynamic_out)
    for seq in (3, 17):
        feeds = {"x": np.random.default_rng(seq).standard_normal((seq, 8)).astype(np.float32)}
        expected = model.run(feeds)
        out_dir = tmp_path / f"o{seq}"
        proc = _run(dynamic_out, *_save(tmp_path, feeds), "--output-dir", out_dir,
                    "--repeat", "2")
        assert proc.returncode == 0, proc.stderr
        assert f"output y: float32 ({seq}, 8)" in proc.stdout
        _assert_outputs(out_dir, expected)
    feeds = {"x": np.zeros((33, 8), np.float32)}
    proc = _run(dynamic_out, *_save(tmp_path, feeds))
    _assert_one_line_error(proc, "input x", "(33, 8)", "(1..32, 8)", code=1)
    proc = _run(dynamic_out)
    _assert_one_line_error(proc, "missing input: x (float32 (1..32, 8))", code=2)


def test_no_python_is_mapped(static_out, tmp_path):
    maps = tmp_path / "maps.txt"
    proc = _run(static_out, *_save(tmp_path, _feeds()), "--maps", maps, "--quiet")
    assert proc.returncode == 0, proc.stderr
    mapped = {line.split(None, 5)[5] for line in maps.read_text().splitlines()
              if len(line.split(None, 5)) == 6}
    assert any(p.endswith("/lib/libhidetc_runtime.so") for p in mapped), mapped
    python = [p for p in mapped if "libpython" in p or "site-packages" in p
              or "/lib-dynload/" in p]
    assert not python, python


def test_sanitized_runner_runs_clean(static_out, dynamic_out, tmp_path):
    """The ASan+UBSan build of the runner and runtime: a threaded run, a dynamic run and
    the error paths exit as the plain build does, with no report (leaks included)."""
    from hidetc.backends.runtime.c_build import INSTALLED, build_runtime

    runner = build_runtime(sanitize="address") / INSTALLED["runner"]
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:exitcode=99",
           "UBSAN_OPTIONS": "halt_on_error=1:exitcode=98"}
    args = _save(tmp_path, _feeds())
    proc = _run(static_out, *args, "--threads", "2", "--repeat", "2", "--output-dir",
                tmp_path / "o", runner=runner, env=env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    _assert_outputs(tmp_path / "o", hidetc.load(static_out).run(_feeds()),
                    {"out/idx": "out_idx.npy"})
    np.save(tmp_path / "dx.npy", np.ones((5, 8), np.float32))
    proc = _run(dynamic_out, "--input", f"x={tmp_path / 'dx.npy'}", "--output-dir",
                tmp_path / "d", runner=runner, env=env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert np.load(tmp_path / "d" / "s.npy").shape == (5,)
    for case in ("dtype", "missing", "not npy", "shape"):
        sub = tmp_path / case.replace(" ", "_")
        sub.mkdir()
        bad_args, code, fragments = _bad(sub, case)
        _assert_one_line_error(_run(static_out, *bad_args, runner=runner, env=env),
                               *fragments, code=code)
    _assert_one_line_error(_run(tmp_path / "nowhere", runner=runner, env=env), code=1)
