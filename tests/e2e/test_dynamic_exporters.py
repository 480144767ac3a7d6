"""Issue 36's target on the exporter zoo: every fixture of tests/data/exporters that the
exporter marks dynamic compiles with one `--dim` per named dimension and no other
option (`helpers.exporter_fixtures.RANGES`, the ranges the importer's symbolic tests
use; verification against ONNX Runtime included), and its artifact agrees with ONNX
Runtime at each range's minimum, its maximum and a prime inside (not the prime the
verification picks). The tiny GPT-2 built with a symbolic sequence
(`models.gpt2.build_gpt2(dynamic=True)`) does the same over its whole range 1..n_ctx
(its position table's rows); a longer range is a one-line error naming the Slice of the
causal mask. Each artifact is compiled once (module-scoped fixtures). On 2 cores, cold
(an empty build cache): the fixtures' compiles take 1.5-11 s and run in the default
suite; the tiny GPT-2's takes 17-25 s (5 variants of 24 kernels; 5 s warm) and is slow.

The fixtures with two symbols of which `batch` spans 1..4 (default tuning sizes 1, 2, 3,
4: 16 cells, and the short-row reductions' `seq >= 16` guard splits some) need about
20 builds and compile in ~30-70 s cold: they are slow."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml
from helpers.exporter_fixtures import DATA, RANGES, assert_matches, reference

import hidetc
from hidetc.driver.api import compile_model
from hidetc.errors import ShapeError
from hidetc.frontend.onnx.importer import load_model
from models.gpt2 import TINY, build_gpt2

VOCAB = {"encoder": 32, "gpt": 40}      # the fixtures' embedding rows (token ids below)
STEMS = [pytest.param(s, marks=pytest.mark.slow) if s in ("encoder_dynamo", "gpt_ts",
                                                            "gpt_dynamo") else s
         for s in sorted(RANGES)]


def _prime_inside(lo: int, hi: int) -> int:
    """The largest prime in lo..(lo + hi) // 2 (verification takes one above the middle),
    else lo."""
    for n in range((lo + hi) // 2, lo, -1):
        if n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1)):
            return n
    return lo


def _sizes(dims: dict) -> list[dict[str, int]]:
    """All at their minimum, all at their maximum, each at a prime inside (a fixed size
    stays itself)."""
    bounds = {n: tuple(int(x) for x in v.split("..")) if isinstance(v, str) else (v, v)
              for n, v in dims.items()}
    return [{n: lo for n, (lo, _) in bounds.items()},
            {n: hi for n, (_, hi) in bounds.items()},
            {n: _prime_inside(lo, hi) for n, (lo, hi) in bounds.items()}]


def _feeds(path, sizes: dict[str, int], seed: int) -> dict[str, np.ndarray]:
    """Random inputs of the ONNX file's declared shapes at `sizes`: floats ~ N(0, 1),
    token ids below the fixture's vocabulary, a padding mask of ones whose last row
    masks its last quarter of positions."""
    rng = np.random.default_rng(seed)
    model = onnx.load(str(path), load_external_data=False)
    feeds = {}
    for info in model.graph.input:
        shape = tuple(sizes[d.dim_param] if d.dim_param else d.dim_value
                      for d in info.type.tensor_type.shape.dim)
        if info.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            feeds[info.name] = rng.standard_normal(shape).astype(np.float32)
        elif info.name == "mask":
            mask = np.ones(shape, np.int64)
            mask[-1, shape[-1] - shape[-1] // 4:] = 0
            feeds[info.name] = mask
        else:
            vocab = VOCAB.get(path.stem.split("_")[0], TINY["vocab"])
            feeds[info.name] = rng.integers(0, vocab, shape).astype(np.int64)
    return feeds


def _check_manifest(out, dims: dict) -> None:
    """The manifest names every range and says verification passed at every size."""
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    symbols = manifest["dynamic"]["symbols"]
    ranged = {n: v for n, v in dims.items() if isinstance(v, str)}
    assert {n: f"{s['min']}..{s['max']}" for n, s in symbols.items()} == ranged
    verified = manifest["verification"]["sizes"]
    assert verified and all(v["status"] == "passed" for v in verified)
    for sizes in _sizes(ranged)[:2]:      # the ends are among the verified sizes
        assert sizes in [v["sizes"] for v in verified]


@pytest.fixture(scope="module", params=STEMS)
def fixture_artifact(request, tmp_path_factory):
    stem = request.param
    out = tmp_path_factory.mktemp(stem) / "out"
    compile_model(DATA / f"{stem}.onnx", out, target="cpu", dims=RANGES[stem], tune=False)
    return stem, out


def test_one_range_per_dimension_compiles_and_verifies(fixture_artifact):
    stem, out = fixture_artifact
    _check_manifest(out, RANGES[stem])


def test_the_ends_and_a_prime_match_onnx_runtime(fixture_artifact):
    stem, out = fixture_artifact
    with hidetc.load(out) as model:
        for k, sizes in enumerate(_sizes(RANGES[stem])):
            feeds = _feeds(DATA / f"{stem}.onnx", sizes, seed=k)
            assert_matches(model.run(feeds), reference(stem, feeds))


@pytest.fixture(scope="module")
def gpt2_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("gpt2") / "gpt2_tiny_dynamic.onnx"
    onnx.save(build_gpt2(tiny=True, dynamic=True), str(path))
    return path


@pytest.fixture(scope="module")
def gpt2_artifact(gpt2_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt2") / "out"
    compile_model(gpt2_path, out, target="cpu", dims={"seq": f"1..{TINY['n_ctx']}"},
                  tune=False)
    return out


@pytest.mark.slow
def test_tiny_gpt2_compiles_over_its_whole_range(gpt2_path, gpt2_artifact):
    dims = {"seq": f"1..{TINY['n_ctx']}"}
    _check_manifest(gpt2_artifact, dims)
    with hidetc.load(gpt2_artifact) as model:
        for k, sizes in enumerate(_sizes(dims)):
            feeds = _feeds(gpt2_path, sizes, seed=k)
            assert_matches(model.run(feeds), reference(gpt2_path, feeds))


def test_tiny_gpt2_past_its_position_table_is_a_one_line_error(gpt2_path):
    with pytest.raises(ShapeError) as info:
        load_model(gpt2_path, dims={"seq": f"1..{TINY['n_ctx'] + 1}"})
    message = str(info.value)
    assert "\n" not in message and "(Slice)" in message, message
    assert f"depends on the sizes (seq in 1..{TINY['n_ctx'] + 1})" in message, message
