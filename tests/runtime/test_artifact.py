"""Artifact directory: atomic writing, replacing, refusing, and every read error."""
import hashlib
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
import yaml

from hidetc.backends.runtime.artifact import (
    FORMAT_VERSION,
    MANIFEST,
    OWNER_FILE,
    REQUIRED_KEYS,
    UNOWNED_GRACE_S,
    ArtifactWriter,
    check_output_dir,
    read_manifest,
    sha256_file,
    utc_now,
)
from hidetc.backends.runtime.memory_plan import PlanValue, plan_memory
from hidetc.backends.runtime.weights import read_weights, write_weights
from hidetc.errors import ArtifactError


def _manifest(entries=None, library="kernels.so", **extra):
    plan = plan_memory([PlanValue("t0", 4 * 8, 0, 1), PlanValue("t1", 4 * 8, 1, 2)])
    m = {
        "format_version": FORMAT_VERSION,
        "hidetc_version": "0.1.0",
        "target": "cpu",
        "created": utc_now(),
        "model": {"file": "model.onnx", "sha256": "0" * 64},
        "inputs": [{"name": "x", "dtype": "float32", "shape": (1, 8)}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": (1, 8)}],
        "kernels": [{"name": "k0", "op": "MatMul", "node": "mm0", "args": ["x", "w", "t0"],
                     "grid": (1, 1, 1)}],
        "memory": plan,
        "weights": {"file": "weights.bin", "entries": entries or {}},
        "library": library,
        "files": {},
        "verification": {"status": "pending"},
        "config": {"opt_level": 2},
    }
    m.update(extra)
    return m


def _write(out, payload=b"\x7fELF fake library", manifest_extra=None):
    with ArtifactWriter(out) as w:
        entries = write_weights(w.path / "weights.bin", {"w": np.eye(8, dtype=np.float32)})
        (w.path / "kernels.so").write_bytes(payload)
        m = w.finish(_manifest(entries, **(manifest_extra or {})))
    return m


def _siblings(out):
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


def test_write_and_read(tmp_path):
    out = tmp_path / "out"
    written = _write(out)
    assert sorted(p.name for p in out.iterdir()) == ["kernels.so", MANIFEST, "weights.bin"]
    assert _siblings(out) == []  # no temp dir left behind
    m = read_manifest(out)
    assert m == written
    assert list(m) == list(REQUIRED_KEYS)
    assert m["files"] == {"kernels.so": sha256_file(out / "kernels.so"),
                          "weights.bin": sha256_file(out / "weights.bin")}
    assert m["inputs"][0]["shape"] == [1, 8]
    assert m["memory"]["offsets"] == {"t0": 0, "t1": 64}
    assert m["created"].endswith("Z") and isinstance(m["created"], str)
    _, views = read_weights(out / m["weights"]["file"], m["weights"]["entries"])
    np.testing.assert_array_equal(views["w"], np.eye(8, dtype=np.float32))


def test_manifest_is_readable_yaml(tmp_path):
    out = tmp_path / "out"
    _write(out)
    text = (out / MANIFEST).read_text()
    assert text.startswith("format_version: 1\n")
    assert "shape: [1, 8]" in text
    assert "args: [x, w, t0]" in text
    assert yaml.safe_load(text)["kernels"][0]["grid"] == [1, 1, 1]


def test_stage_manifest_makes_temp_dir_loadable(tmp_path):
    out = tmp_path / "out"
    with ArtifactWriter(out) as w:
        (w.path / "kernels.so").write_bytes(b"lib")
        write_weights(w.path / "weights.bin", {})
        w.stage_manifest(_manifest())
        assert not out.exists()
        staged = read_manifest(w.path)
        assert staged["verification"] == {"status": "pending"}
        final = _manifest(verification={"status": "passed", "outputs": {}})
        w.finish(final)
    assert read_manifest(out)["verification"]["status"] == "passed"
    assert _siblings(out) == []


def test_replaces_existing_artifact(tmp_path):
    out = tmp_path / "out"
    _write(out, payload=b"old")
    (out / "stale.txt").write_text("from the old artifact")
    _write(out, payload=b"new")
    assert (out / "kernels.so").read_bytes() == b"new"
    assert not (out / "stale.txt").exists()
    assert _siblings(out) == []
    read_manifest(out)


def test_replaces_empty_directory(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    written = _write(out)
    assert read_manifest(out) == written and (out / "weights.bin").is_file()
    assert _siblings(out) == []                   # nothing left beside it


def test_creates_missing_parents(tmp_path):
    out = tmp_path / "a" / "b" / "out"
    written = _write(out)
    assert read_manifest(out) == written and _siblings(out) == []


@pytest.mark.parametrize("kind", ["file", "nonempty_dir"])
def test_refuses_non_artifact(tmp_path, kind):
    out = tmp_path / "out"
    if kind == "file":
        out.write_text("precious")
    else:
        out.mkdir()
        (out / "precious.txt").write_text("precious")
    with pytest.raises(ArtifactError, match="exists and is not a hidetc artifact; remove it "
                                            "or choose another -o"):
        with ArtifactWriter(out):
            pytest.fail("the with-block must not run")
    with pytest.raises(ArtifactError):
        check_output_dir(out)
    assert _siblings(out) == []  # no temp dir was created
    if kind == "file":
        assert out.read_text() == "precious"
    else:
        assert (out / "precious.txt").read_text() == "precious"


def test_exception_inside_leaves_old_artifact_intact(tmp_path):
    out = tmp_path / "out"
    _write(out, payload=b"old")
    before = read_manifest(out)
    with pytest.raises(RuntimeError, match="boom"):
        with ArtifactWriter(out) as w:
            (w.path / "kernels.so").write_bytes(b"new")
            w.stage_manifest(_manifest())
            raise RuntimeError("boom")
    assert _siblings(out) == []
    assert read_manifest(out) == before
    assert (out / "kernels.so").read_bytes() == b"old"


def test_no_finish_leaves_nothing(tmp_path):
    out = tmp_path / "out"
    with ArtifactWriter(out) as w:
        (w.path / "kernels.so").write_bytes(b"lib")
    assert not out.exists()
    assert _siblings(out) == []


def test_finish_validates_manifest(tmp_path):
    out = tmp_path / "out"
    bad = _manifest()
    del bad["kernels"]
    with pytest.raises(ArtifactError, match="missing required key.*kernels"):
        with ArtifactWriter(out) as w:
            (w.path / "kernels.so").write_bytes(b"lib")
            write_weights(w.path / "weights.bin", {})
            w.finish(bad)
    assert not out.exists() and _siblings(out) == []


def _leftover(out, kind: str, owner) -> "os.PathLike":
    """A temp dir as a dead (or live) writer leaves it next to `out`."""
    path = out.parent / f".{out.name}.{kind}-{os.urandom(4).hex()}"
    path.mkdir()
    (path / "kernels.so").write_bytes(b"half written")
    if owner is not None:
        (path / OWNER_FILE).write_text(json.dumps(owner))
    return path


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    """A compile killed mid-way leaves `.OUT.tmp-*` (or, mid-swap, `.OUT.old-*`); the
    next writer into OUT removes those whose owner process is gone (a reused pid with
    another start time counts as gone), keeps a live writer's, another host's, and an
    unowned one until it is older than the grace period. The finished artifact holds no
    owner record."""
    out = tmp_path / "out"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    host = socket.gethostname()
    gone = [_leftover(out, "tmp", {"host": host, "pid": int(dead.stdout), "start": "1"}),
            _leftover(out, "old", {"host": host, "pid": int(dead.stdout), "start": "1"}),
            _leftover(out, "tmp", {"host": host, "pid": os.getpid(), "start": "0"}),
            _leftover(out, "tmp", None)]
    old = os.path.getmtime(gone[-1]) - UNOWNED_GRACE_S - 60
    os.utime(gone[-1], (old, old))
    kept = [_leftover(out, "tmp", {"host": host, "pid": os.getpid(), "start": None}),
            _leftover(out, "tmp", {"host": host + "-elsewhere", "pid": 1, "start": None}),
            _leftover(out, "tmp", None)]
    other = tmp_path / ".other.tmp-1234"            # another OUT's: not ours to judge
    other.mkdir()
    _write(out)
    assert not any(p.exists() for p in gone)
    assert all(p.exists() for p in kept) and other.exists()
    assert not (out / OWNER_FILE).exists() and OWNER_FILE not in read_manifest(out)["files"]


# ------------------------------------------------------------------ read errors


def _one_line(excinfo):
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


def test_read_modified_file(tmp_path):
    out = tmp_path / "out"
    _write(out)
    with open(out / "weights.bin", "r+b") as f:
        f.seek(10)
        f.write(b"\xff")
    with pytest.raises(ArtifactError) as e:
        read_manifest(out)
    assert _one_line(e) == f"{out}/weights.bin: checksum mismatch (file modified or corrupted)"
    read_manifest(out, verify_checksums=False)  # the fast path skips hashing


def test_read_missing_file(tmp_path):
    out = tmp_path / "out"
    _write(out)
    os.remove(out / "kernels.so")
    with pytest.raises(ArtifactError, match="kernels.so: listed in the manifest but missing"):
        read_manifest(out, verify_checksums=False)


def test_read_newer_format(tmp_path):
    out = tmp_path / "out"
    _write(out)
    m = yaml.safe_load((out / MANIFEST).read_text())
    m["format_version"] = FORMAT_VERSION + 1
    m["something_new"] = {}
    del m["kernels"]  # a newer format may change keys: the version is reported first
    (out / MANIFEST).write_text(yaml.safe_dump(m, sort_keys=False))
    with pytest.raises(ArtifactError) as e:
        read_manifest(out)
    assert _one_line(e) == (f"{out}/manifest.yaml: format version 2 is newer than this "
                            f"hidetc supports (1); upgrade hidetc")


def test_read_not_an_artifact(tmp_path):
    with pytest.raises(ArtifactError) as e:
        read_manifest(tmp_path)
    assert _one_line(e) == f"{tmp_path}: not a hidetc artifact (no manifest.yaml)"
    (tmp_path / "f").write_text("x")
    with pytest.raises(ArtifactError, match="not a hidetc artifact"):
        read_manifest(tmp_path / "f")
    with pytest.raises(ArtifactError, match="no such artifact directory"):
        read_manifest(tmp_path / "missing")


@pytest.mark.parametrize("text", ["format_version: [1,\n", "a: b: c\n", "\t- x\n"])
def test_read_bad_yaml(tmp_path, text):
    (tmp_path / MANIFEST).write_text(text)
    with pytest.raises(ArtifactError, match=r"manifest.yaml: not valid YAML \(.*line \d+\)"
                       ) as e:
        read_manifest(tmp_path)
    _one_line(e)


@pytest.mark.parametrize("mutate, message", [
    (lambda m: m.pop("memory"), "missing required key"),
    (lambda m: m.__setitem__("kernels", {}), "kernels has the wrong type"),
    (lambda m: m["inputs"][0].pop("dtype"), r"inputs\[0\] is missing dtype"),
    (lambda m: m["weights"].pop("entries"), "weights is missing entries"),
    (lambda m: m.__setitem__("format_version", "1"), "format_version has the wrong type"),
    (lambda m: m.__setitem__("format_version", 0), "invalid format version 0"),
    (lambda m: m["files"].pop("kernels.so"), "'kernels.so' is referenced but not listed"),
    (lambda m: m["files"].__setitem__("../etc/passwd", "0"), "is not inside the artifact"),
])
def test_read_schema_errors(tmp_path, mutate, message):
    out = tmp_path / "out"
    _write(out)
    m = yaml.safe_load((out / MANIFEST).read_text())
    mutate(m)
    (out / MANIFEST).write_text(yaml.safe_dump(m, sort_keys=False))
    with pytest.raises(ArtifactError, match=message) as e:
        read_manifest(out)
    _one_line(e)


def test_read_top_level_not_mapping(tmp_path):
    (tmp_path / MANIFEST).write_text("- 1\n- 2\n")
    with pytest.raises(ArtifactError, match="expected a mapping at the top level"):
        read_manifest(tmp_path)


def test_unknown_files_are_ignored(tmp_path):
    out = tmp_path / "out"
    written = _write(out)
    (out / "notes.txt").write_text("added by a user")
    manifest = read_manifest(out)
    assert manifest == written and "notes.txt" not in manifest["files"]


def test_large_file_hashing_in_chunks(tmp_path):
    path = tmp_path / "big.bin"
    data = os.urandom(3 * (1 << 20) + 17)
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
