"""The CUDA runtime on a dynamic artifact, against the fake pycuda driver
(`helpers.fake_cuda`): each size runs its dispatch variant's launches at its grid and
size arguments, a CUDA graph captured per shape in a bounded least-recently-used cache,
bad sizes one line; and the manifest's launches bound at a pass's sizes."""
from pathlib import Path

import numpy as np
import pytest
from helpers.cuda_artifact import N, artifact, launch

from hidetc.backends.runtime.cuda.executor import CudaExecutor
from hidetc.backends.runtime.cuda.manifest import pack_args, parse_section
from hidetc.errors import ArtifactError, InputError


def dynamic_artifact(root: Path, graph_cache: int = 2) -> dict:
    """The two-kernel artifact over a range: x and y of n floats, n in 1..N; two
    dispatch variants (n <= 64, and the rest at another arena offset), grids and the
    kernels' n argument from the sizes."""
    manifest = artifact(root, {"sm_90": "a.cubin"}, arena=8 * N)
    w = manifest["weights"]["entries"]["w"]["offset"]

    def launches(at):
        return [launch("scale_bias_sized", ["((255 + n)//256)"], [256],
                       [["input", 0], ["weights", w], ["arena", at], ["size", 0]]),
                launch("relu_reverse_sized", [1], [256],
                       [["arena", at], ["output", 0], ["size", 0]])]
    manifest["inputs"][0]["shape"] = ["n"]
    manifest["outputs"][0]["shape"] = ["n"]
    manifest["cuda"]["launches"] = launches(0)
    manifest["cuda"]["variant_launches"] = [launches(4 * N)]
    manifest["dynamic"] = {"symbols": {"n": {"min": 1, "max": N, "opts": [16, N]}},
                           "order": ["n"], "graph_cache": graph_cache,
                           "variants": [{"guards": ["-64 + n <= 0"], "forward": "v0"},
                                        {"guards": ["-65 + n >= 0"], "forward": "v1"}]}
    return manifest


def sized_expected(x: np.ndarray) -> np.ndarray:
    n = x.size
    w = np.linspace(-1, 1, 2 * N, dtype=np.float32)
    return np.maximum(x * w[:n] + w[N:N + n], 0)[::-1]


def test_fake_dynamic_runs_any_size_on_a_graph_per_shape(fake, tmp_path):
    """Each size runs its variant's launches at its grid and size argument, captured
    once per shape; the warm-up ran the largest size; outputs have the pass's shape."""
    ex = CudaExecutor(tmp_path, dynamic_artifact(tmp_path, graph_cache=8))
    assert ex.uses_graph and not fake.graphs.graphs        # captured per shape, on use
    assert fake.grids == [("scale_bias_sized", (N // 256, 1, 1)),
                          ("relu_reverse_sized", (1, 1, 1))]      # warm-up at n = N
    for n in (1, 64, 65, 300, N, 300):
        fake.grids.clear()
        x = np.random.default_rng(n).standard_normal(n, dtype=np.float32)
        y = ex.run({"x": x})["y"]
        assert y.shape == (n,)
        np.testing.assert_array_equal(y, sized_expected(x))
    assert len(fake.graphs.graphs) == 5          # one per distinct size; 300 replayed
    assert fake.grids == []                      # the second 300: a replay, no capture
    assert ex.profile({"x": np.ones(100, np.float32)}, repeat=1) == [0.25, 0.25]
    ex.close()
    assert sorted(fake.graphs.destroyed) == sorted(fake.graphs.graphs)


def test_fake_dynamic_graph_cache_evicts_the_least_recently_used(fake, tmp_path):
    ex = CudaExecutor(tmp_path, dynamic_artifact(tmp_path, graph_cache=2))
    graph_of = {}
    for n in (5, 7, 9, 7, 11, 7):
        before = set(fake.graphs.graphs)
        x = np.full(n, 0.5, np.float32)
        np.testing.assert_array_equal(ex.run({"x": x})["y"], sized_expected(x))
        graph_of.update({n: h for h in set(fake.graphs.graphs) - before})
    # 5, 7 captured; 9 evicts 5; 7 is used again; 11 evicts 9 (7 more recent); 7 replays
    assert sorted(graph_of) == [5, 7, 9, 11]
    assert fake.graphs.destroyed == [graph_of[5], graph_of[9]]
    assert CudaExecutor(tmp_path, dynamic_artifact(tmp_path), graph_cache=5).graph_cache == 5
    ex.close()


def test_fake_dynamic_bad_sizes_are_one_line_and_keep_the_context(fake, tmp_path):
    ex = CudaExecutor(tmp_path, dynamic_artifact(tmp_path))
    with pytest.raises(InputError, match=r"input 'x' dim 0 \('n'\) is 16385, outside its "
                                         r"range 1..16384"):
        ex.run({"x": np.zeros(N + 1, np.float32)})
    x = np.ones(3, np.float32)
    np.testing.assert_array_equal(ex.run({"x": x})["y"], sized_expected(x))


def test_dynamic_launches_bind_their_sizes():
    section = parse_section(_section_only())
    first, other = section.launches[0], section.variant_launches[0][0]
    assert first.symbolic and not other.symbolic and len(section.variants) == 2
    bound = first.at({"n": 300}, ["n"])
    assert bound.grid == (2, 1, 1) and bound.args[-1] == ("i64", 300) and not bound.symbolic
    with pytest.raises(ArtifactError, match="pack the launch of one pass"):
        pack_args(first, [0], [0], (0, 64), (0, 64))
    with pytest.raises(ArtifactError, match="outside the CUDA limits"):
        first.at({"n": 2 ** 40}, ["n"])
    bad = _section_only()
    bad["cuda"]["launches"][0]["grid"] = ["n +"]
    with pytest.raises(ArtifactError, match="grid dimension 'n \\+' is not an expression"):
        parse_section(bad)


def _section_only() -> dict:
    return {"cuda": {"modules": [{"name": "model", "cubins": {"sm_90": "a.cubin"}}],
                     "launches": [launch("k", ["((255 + n)//256)"], [256],
                                         [["arena", 0], ["size", 0]])],
                     "variant_launches": [[launch("k", [1], [256], [["arena", 0]])]]}}


def test_fake_dynamic_zeroes_a_variants_kept_zero_region_when_the_variant_changes(
        fake, tmp_path):
    """Each variant lays out its own arena: variant 1 keeps its split-K counters where
    variant 0 writes activations, and variant 0 its counters where variant 1 does. A
    pass that changes the variant zeroes the new one's region first (on the context's
    stream, ahead of its launches); passes that keep the variant do not (a completed
    pass leaves its region zero)."""
    manifest = dynamic_artifact(tmp_path, graph_cache=8)
    regions = {0: 8 * N - 64, 1: 128}        # inside the other variant's activations
    manifest["memory"]["offsets"] = {"scratch.zeroed": regions[0]}
    manifest["memory"]["bytes"] = {"scratch.zeroed": 64}
    manifest["dynamic"]["variants"][1]["memory"] = {"offsets": {"scratch.zeroed": regions[1]},
                                                    "bytes": {"scratch.zeroed": 64}}
    ex = CudaExecutor(tmp_path, manifest)
    memsets = [g for g in fake.grids if g[0] == "memset"]
    assert [n for _, _, n in memsets] == [64]                # the warm-up's (n = N)
    arena = memsets[0][1] - regions[1]
    # (n, its variant, zeroed first, the region dirty before: the other variant's last
    # pass wrote activations over it)
    for n, variant, zeroed, dirty in ((64, 0, True, True), (64, 0, False, False),
                                      (300, 1, True, True), (200, 1, False, False),
                                      (5, 0, True, False), (300, 1, True, False)):
        assert fake.read(arena + regions[variant], 64).any() == dirty
        fake.grids.clear()
        x = np.full(n, 0.75, np.float32)
        np.testing.assert_array_equal(ex.run({"x": x})["y"], sized_expected(x))
        memsets = [g for g in fake.grids if g[0] == "memset"]
        assert memsets == ([("memset", arena + regions[variant], 64)] if zeroed else [])
        if zeroed:
            assert fake.grids[0][0] == "memset"               # ahead of the launches
        assert not fake.read(arena + regions[variant], 64).any()
    ex.close()
