"""One artifact for a range of sizes (issue 36): compiled with `--dim NAME=lo..hi`,
verified against ONNX Runtime at several sizes of each range, and run at any size in
the ranges -- every size agreeing with ONNX Runtime; a size outside its range, or
inputs disagreeing on a shared size, is a one-line error."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from helpers.exporter_fixtures import DATA, assert_matches, reference

import hidetc
from hidetc.driver.api import compile_model
from hidetc.errors import InputError
from hidetc.tools.cli import main


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    out = tmp_path_factory.mktemp("cnn") / "out"
    result = CliRunner().invoke(main, ["compile", str(DATA / "cnn_ts.onnx"), "-o", str(out),
                                       "--target", "cpu", "--dim", "batch=1..8"])
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "verification: passed" in result.output
    return out


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    out = tmp_path_factory.mktemp("encoder") / "out"
    compile_model(DATA / "encoder_dynamo.onnx", out, target="cpu",
                  dims={"batch": "1..3", "seq": "1..40"})
    return out


def test_the_manifest_says_the_ranges_and_every_verified_size(cnn):
    manifest = yaml.safe_load((cnn / "manifest.yaml").read_text())
    assert manifest["inputs"] == [{"name": "x", "dtype": "float32",
                                   "shape": ["batch", 3, 16, 16]}]
    assert manifest["outputs"][0]["shape"][0] == "batch"
    dynamic = manifest["dynamic"]
    assert dynamic["symbols"] == {"batch": {"min": 1, "max": 8, "opt": [1, 2, 4, 8]}}
    assert dynamic["order"] == ["batch"]
    # one build per interval around 1, 2, 4, 8; the one-size cells are static code
    assert [v["static"] for v in dynamic["variants"]] == [True, True, False, False]
    verified = manifest["verification"]["sizes"]
    assert {v["sizes"]["batch"] for v in verified} >= {1, 2, 8} and \
        all(v["status"] == "passed" for v in verified)
    assert any(v["sizes"]["batch"] not in (1, 2, 4, 8) for v in verified)   # a prime


@pytest.mark.parametrize("batch", [1, 3, 6, 8])
def test_every_size_in_the_range_matches_onnx_runtime(cnn, batch):
    x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
    with hidetc.load(cnn) as model:
        assert_matches(model.run({"x": x}), reference("cnn_ts", {"x": x}))


def test_sizes_outside_the_range_are_one_line_errors(cnn):
    with hidetc.load(cnn) as model:
        for bad, fragments in (((9, 3, 16, 16), ["input 'x' dim 0 ('batch') is 9",
                                                 "outside its range 1..8"]),
                               ((2, 3, 16, 15), ["input 'x'", "expected shape [2, 3, 16, 16]"]),
                               ((2, 3, 16), ["expected 4 dimensions"])):
            with pytest.raises(InputError) as info:
                model.run({"x": np.zeros(bad, np.float32)})
            message = str(info.value)
            assert "\n" not in message
            for fragment in fragments:
                assert fragment in message, message


def test_two_symbols_dispatch_over_variants_and_match_everywhere(encoder):
    manifest = yaml.safe_load((encoder / "manifest.yaml").read_text())
    variants = manifest["dynamic"]["variants"]
    assert len(variants) >= 1 and all("forward" in v for v in variants)
    with hidetc.load(encoder) as model:
        for batch, seq in ((1, 1), (2, 13), (3, 40), (1, 16), (2, 15), (3, 29)):
            ids = np.random.default_rng(seq).integers(0, 32, (batch, seq)).astype(np.int64)
            assert_matches(model.run({"ids": ids}), reference("encoder_dynamo", {"ids": ids}))


def test_a_shared_size_must_agree_across_inputs(tmp_path):
    out = tmp_path / "gpt"
    compile_model(DATA / "gpt_dynamo.onnx", out, target="cpu",
                  dims={"batch": "1..2", "seq": "1..32"})
    ids = np.zeros((2, 5), np.int64)
    with hidetc.load(out) as model:
        with pytest.raises(InputError, match=r"^input 'mask' dim 1 is 6, but 'seq' is 5 "
                                             r"\(input 'ids' dim 1\)$"):
            model.run({"ids": ids, "mask": np.ones((2, 6), np.int64)})
        got = model.run({"ids": ids, "mask": np.ones((2, 5), np.int64)})
    assert_matches(got, reference("gpt_dynamo", {"ids": ids,
                                                 "mask": np.ones((2, 5), np.int64)}))


def test_hidetc_run_takes_any_size_in_the_range(cnn, tmp_path):
    for batch in (2, 5):
        x = np.random.default_rng(7).standard_normal((batch, 3, 16, 16)).astype(np.float32)
        np.save(tmp_path / "x.npy", x)
        result = CliRunner().invoke(main, ["run", str(cnn), "--input", str(tmp_path / "x.npy"),
                                           "--output", str(tmp_path / "y.npz"),
                                           "--repeat", "1"])
        assert result.exit_code == 0, result.output + str(result.exception)
        with np.load(tmp_path / "y.npz") as saved:
            assert_matches(dict(saved), reference("cnn_ts", {"x": x}))


def test_hidetc_run_without_input_and_with_compare(cnn, tmp_path):
    """No --input: random inputs at each range's largest tuning size; --compare runs
    ONNX Runtime on the same size."""
    result = CliRunner().invoke(main, ["run", str(cnn), "--repeat", "1", "--compare",
                                       str(DATA / "cnn_ts.onnx")])
    assert result.exit_code == 0, result.output + str(result.exception)
    assert "at batch=8" in result.stderr and "vs onnxruntime" in result.output


def test_inspect_shows_the_variants_and_memory_by_size(cnn):
    result = CliRunner().invoke(main, ["inspect", str(cnn)])
    assert result.exit_code == 0, result.output
    assert "sizes:   batch 1..8 (tuning 1, 2, 4, 8)" in result.output
    assert "v0 (hidetc_forward): batch <= 1; planned at batch=1" in result.output
    assert "v3 (hidetc_forward_v3): batch >= 6; planned at batch=8" in result.output
    assert "memory by size (arena + inputs + outputs): min " in result.output


def test_threads_at_different_sizes_give_the_single_threaded_results(encoder):
    """One loaded dynamic artifact served from 4 threads at once, each at its own
    sizes (and so its own dispatch variants): every result bit for bit the one a
    single thread gets."""
    sizes = [(1, 1), (3, 40), (2, 15), (1, 16), (2, 7), (3, 23)]
    feeds = [{"ids": np.random.default_rng(b * 100 + s).integers(0, 32, (b, s))
              .astype(np.int64)} for b, s in sizes]
    with hidetc.load(encoder) as model:
        alone = [model.run(f)["logits"] for f in feeds]
        with ThreadPoolExecutor(4) as pool:
            for _ in range(3):
                together = list(pool.map(lambda f: model.run(f)["logits"], feeds * 2))
                for k, got in enumerate(together):
                    np.testing.assert_array_equal(got, alone[k % len(feeds)])


def test_a_profile_names_the_launches_of_the_size_s_variant(cnn):
    """Per-launch times at a size of each variant, named by that variant's kernels."""
    manifest = yaml.safe_load((cnn / "manifest.yaml").read_text())
    variants = manifest["dynamic"]["variants"]
    with hidetc.load(cnn) as model:
        for batch, k in ((1, 0), (8, len(variants) - 1)):
            x = np.zeros((batch, 3, 16, 16), np.float32)
            rows = model.profile({"x": x}, repeat=2)
            names = [r["name"] for r in variants[k]["launch_kernels"]] if k else \
                [kernel["name"] for kernel in manifest["kernels"]]
            assert [r["kernel"] for r in rows] == names and all(r["ms"] >= 0 for r in rows)


@pytest.mark.parametrize("batch", [1, 5])
def test_a_launch_by_launch_run_follows_the_size_s_variant(cnn, batch):
    """run_with_hook at a size of each variant: that variant's launch table and arena
    layout, the sizes passed to its kernels; the outputs those of a plain pass, and the
    hook sees every launch's written values where the variant placed them."""
    x = np.random.default_rng(batch).standard_normal((batch, 3, 16, 16)).astype(np.float32)
    seen = []

    def hook(when, step, place):
        if when == "after":
            seen.append(step)
    with hidetc.load(cnn) as model:
        plain = model.run({"x": x})
        hooked = model.run_with_hook({"x": x}, hook)
        variant = model._executor.pass_of({"x": x}).variant
    manifest = yaml.safe_load((cnn / "manifest.yaml").read_text())
    count = manifest["dynamic"]["variants"][variant]["kernels"]
    assert seen == list(range(count)) and (variant > 0) == (batch > 1)
    np.testing.assert_array_equal(hooked["logits"], plain["logits"])
