"""Weights file: round trip, dtypes, alignment, zero-copy views, truncation."""
import numpy as np
import pytest

from hidetc.backends.runtime.weights import WeightEntry, read_weights, write_weights
from hidetc.errors import ArtifactError


def _arrays():
    rng = np.random.default_rng(0)
    return {
        "w_f32": rng.standard_normal((3, 5)).astype(np.float32),
        "w_f16": rng.standard_normal((7,)).astype(np.float16),
        "idx_i64": np.arange(-5, 6, dtype=np.int64).reshape(11, 1),
        "mask": np.array([True, False, True]),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "u8": np.arange(3, dtype=np.uint8),
        "transposed": np.arange(12, dtype=np.float64).reshape(3, 4).T,  # not C-contiguous
        "big_endian": np.arange(4, dtype=">i4"),
    }


@pytest.mark.parametrize("mmap", [True, False])
def test_round_trip(tmp_path, mmap):
    arrays = _arrays()
    entries = write_weights(tmp_path / "weights.bin", arrays)
    assert list(entries) == list(arrays)
    blob, views = read_weights(tmp_path / "weights.bin", entries, mmap=mmap)
    assert blob.dtype == np.uint8 and blob.ndim == 1
    for name, a in arrays.items():
        v = views[name]
        assert v.shape == a.shape
        assert v.dtype.name == a.dtype.name
        np.testing.assert_array_equal(v, a)
    assert entries["scalar"].shape == () and float(views["scalar"]) == 2.5
    assert entries["big_endian"].dtype == "int32"
    assert views["big_endian"].dtype == np.dtype("<i4")


def test_views_share_the_blob(tmp_path):
    entries = write_weights(tmp_path / "w.bin", _arrays())
    blob, views = read_weights(tmp_path / "w.bin", entries, mmap=False)
    blob[entries["u8"].offset] = 42
    assert views["u8"][0] == 42
    for v in views.values():
        assert np.shares_memory(v, blob) or v.size == 0


def test_mmap_views_are_read_only(tmp_path):
    entries = write_weights(tmp_path / "w.bin", {"a": np.ones(4, np.float32)})
    _, views = read_weights(tmp_path / "w.bin", entries)
    assert not views["a"].flags.writeable


@pytest.mark.parametrize("alignment", [1, 16, 64, 4096])
def test_alignment(tmp_path, alignment):
    entries = write_weights(tmp_path / "w.bin", _arrays(), alignment=alignment)
    assert all(e.offset % alignment == 0 for e in entries.values())
    ends = [e.offset + e.nbytes for e in entries.values()]
    assert (tmp_path / "w.bin").stat().st_size == max(ends)
    offsets = [e.offset for e in entries.values()]
    assert offsets == sorted(offsets)


def test_deterministic_bytes(tmp_path):
    write_weights(tmp_path / "a.bin", _arrays())
    write_weights(tmp_path / "b.bin", _arrays())
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()


def test_entries_from_manifest_dicts(tmp_path):
    arrays = _arrays()
    entries = write_weights(tmp_path / "w.bin", arrays)
    as_dicts = {k: e.to_dict() for k, e in entries.items()}
    assert as_dicts["scalar"]["shape"] == []
    assert WeightEntry.from_dict(as_dicts["w_f32"]) == entries["w_f32"]
    _, views = read_weights(tmp_path / "w.bin", as_dicts)
    np.testing.assert_array_equal(views["w_f32"], arrays["w_f32"])


def test_empty_file(tmp_path):
    entries = write_weights(tmp_path / "w.bin", {})
    assert entries == {}
    blob, views = read_weights(tmp_path / "w.bin", {})
    assert blob.size == 0 and views == {}
    entries = write_weights(tmp_path / "z.bin", {"e": np.zeros(0, np.float32)})
    _, views = read_weights(tmp_path / "z.bin", entries)
    assert views["e"].shape == (0,)


def test_truncated_file(tmp_path):
    path = tmp_path / "weights.bin"
    entries = write_weights(path, {"a": np.ones(100, np.float32), "b": np.ones(50, np.int64)})
    data = path.read_bytes()
    path.write_bytes(data[:-8])
    with pytest.raises(ArtifactError, match=r"weights.bin: truncated: weight 'b'") as e:
        read_weights(path, entries)
    assert "\n" not in str(e.value)


def test_missing_file_and_malformed_entries(tmp_path):
    with pytest.raises(ArtifactError, match="missing"):
        read_weights(tmp_path / "nope.bin", {})
    path = tmp_path / "w.bin"
    entries = write_weights(path, {"a": np.ones(4, np.float32)})
    good = entries["a"].to_dict()
    with pytest.raises(ArtifactError, match="unknown dtype"):
        read_weights(path, {"a": {**good, "dtype": "float99"}})
    with pytest.raises(ArtifactError, match="entry says 12 bytes"):
        read_weights(path, {"a": {**good, "nbytes": 12}})
    with pytest.raises(ArtifactError, match="malformed"):
        read_weights(path, {"a": {"offset": 0}})
    with pytest.raises(ArtifactError, match="malformed"):
        read_weights(path, {"a": {**good, "offset": -64}})


def test_unsupported_dtype_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unsupported dtype"):
        write_weights(tmp_path / "w.bin", {"s": np.array(["x"])})
    with pytest.raises(ValueError, match="power of two"):
        write_weights(tmp_path / "w.bin", {}, alignment=3)
