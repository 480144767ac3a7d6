"""The tuning records store: round trips, keys stable across processes, two processes
writing one store at once, re-tuning replaces, export/import (the cross-compile path),
malformed files as one-line errors, configs resolved against a template's space, and
the `hidetc records` commands."""
from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import targets

from hidetc.compute.task import Task
from hidetc.driver.tune.keys import RecordKey, cpu_arch, cpu_device, key_for, task_digest
from hidetc.driver.tune.records import CandidateResult, RecordStore, resolve_config
from hidetc.errors import RecordsError
from hidetc.graph.ir import TensorType, freeze_attr
from hidetc.schedules.cpu import TEMPLATES
from hidetc.tools.cli import main


def _matmul(m: int = 64, k: int = 48, n: int = 32) -> Task:
    f = "float32"
    return Task("MatMul", (TensorType(f, (m, k)), TensorType(f, (k, n))),
                (TensorType(f, (m, n)),), (), (None, None))


def _key(i: int = 0, device: str = "cpu:test", arch: str = "x86-64-avx2") -> RecordKey:
    return key_for(_matmul(m=i + 1), "cpu.matmul", device, arch, "gcc 12")


RESULTS = [CandidateResult("A(1)", 2.5), CandidateResult("A(2)", 1.5),
           CandidateResult("A(3)", None, "wrong result: rel error 3e-2")]


def test_round_trip_and_reopen(tmp_path):
    path = tmp_path / "r.sqlite"
    key = _key()
    with RecordStore(path) as store:
        assert store.winner(key) is None and store.candidates(key) == []
        store.save(key, RESULTS, "A(2)")
        assert store.winner(key) == "A(2)"
        assert store.candidates(key) == RESULTS
        with pytest.raises(ValueError):
            store.save(key, RESULTS, "A(9)")
    with RecordStore(path) as store:          # the next compile sees the same records
        assert store.winner(key) == "A(2)"
        [entry] = store.entries()
        assert entry["signature"].startswith("MatMul(float32[1,48]")
        assert (entry["measured"], entry["failed"], entry["time_ms"]) == (2, 1, 1.5)
        assert store.winner(_key(1)) is None
        assert store.winner(replace(key, hidetc="0.0.1")) is None
        assert store.winner(replace(key, toolchain="gcc 13")) is None


def test_all_failed_has_no_winner(tmp_path):
    with RecordStore(tmp_path / "r.sqlite") as store:
        store.save(_key(), RESULTS[2:], None)
        assert store.winner(_key()) is None
        assert store.entries()[0]["failed"] == 1


def test_resave_replaces(tmp_path):
    with RecordStore(tmp_path / "r.sqlite") as store:
        store.save(_key(), RESULTS, "A(2)")
        store.save(_key(), [CandidateResult("B", 0.5)], "B")
        assert store.winner(_key()) == "B"
        assert store.candidates(_key()) == [CandidateResult("B", 0.5)]
        assert len(store.entries()) == 1


def test_digest_is_stable_across_processes_and_normalized():
    task = _matmul()
    code = ("from hidetc.graph.ir import TensorType as T; from hidetc.compute.task import "
            "Task; from hidetc.driver.tune.keys import task_digest; f='float32'; "
            "print(task_digest(Task('MatMul', (T(f, (64, 48)), T(f, (48, 32))), "
            "(T(f, (64, 32)),), (), (None, None))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == task_digest(task)
    x = TensorType("float32", (2, 6))
    shape = np.array([3, 4], dtype=np.int64)
    raw = Task("Reshape", (x, TensorType("int64", (2,))), (TensorType("float32", (3, 4)),),
               (("allowzero", np.int64(0)),), (None, shape))
    frozen = replace(raw, attrs=(("allowzero", 0),), params=(None, freeze_attr(shape)))
    assert task_digest(raw) == task_digest(frozen)
    assert task_digest(frozen) != task_digest(replace(frozen, params=(None, (4, 3))))
    assert _key() == replace(_key(), signature="other")   # the signature is not the key


WRITER = textwrap.dedent("""
    import sys
    from hidetc.driver.tune.keys import RecordKey
    from hidetc.driver.tune.records import CandidateResult, RecordStore
    path, who = sys.argv[1], sys.argv[2]
    with RecordStore(path) as store:
        for i in range(50):
            key = RecordKey("cpu.matmul", f"{who}-{i}", "cpu:test", "x86", "gcc")
            store.save(key, [CandidateResult("a", 1.0 + i), CandidateResult("b", None,
                       "timeout")], "a")
            assert store.winner(key) == "a"
""")


def test_two_processes_share_one_store(tmp_path):
    path = tmp_path / "shared.sqlite"          # created by the racing writers themselves
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), who],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for who in ("p", "q")]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "locked" not in err
    with RecordStore(path) as store:
        entries = store.entries()
        assert len(entries) == 100
        assert {e["task"] for e in entries} == {f"{w}-{i}" for w in "pq" for i in range(50)}
        assert all(e["winner"] == "a" and e["measured"] == 1 for e in entries)


def _filled(path) -> RecordStore:
    store = RecordStore(path)
    store.save(_key(0), RESULTS, "A(2)", measured_at="2026-01-01T00:00:00+00:00")
    store.save(_key(1, device="cuda:NVIDIA H200", arch="sm_90"), RESULTS[:1], "A(1)",
               measured_at="2026-01-02T00:00:00+00:00")
    store.save(_key(2), RESULTS[2:], None, measured_at="2026-01-03T00:00:00+00:00")
    return store


def test_export_import_round_trip(tmp_path):
    with _filled(tmp_path / "gpu.sqlite") as source:
        assert source.export(tmp_path / "r.jsonl") == 3
        expected = source.entries(with_candidates=True)
    with RecordStore(tmp_path / "ci.sqlite") as target:
        target.save(_key(0), [CandidateResult("old", 9.0)], "old")   # replaced by import
        target.save(_key(5), [CandidateResult("kept", 1.0)], "kept")  # untouched
        assert target.import_file(tmp_path / "r.jsonl") == 3
        got = target.entries(with_candidates=True)
        assert [e for e in got if e["task"] != _key(5).task] == expected
        assert target.winner(_key(5)) == "kept"
        target.export(tmp_path / "again.jsonl")
    with RecordStore(tmp_path / "fresh.sqlite") as fresh:
        fresh.import_file(tmp_path / "r.jsonl")
        fresh.export(tmp_path / "fresh.jsonl")
    assert (tmp_path / "fresh.jsonl").read_bytes() == (tmp_path / "r.jsonl").read_bytes()


def test_cross_compile_lookup_ignores_the_device(tmp_path):
    with _filled(tmp_path / "r.sqlite") as store:
        ci_key = _key(1, device="cpu:CI runner", arch="sm_90")  # no GPU on the CI machine
        assert store.winner(ci_key) is None
        found = store.lookup(ci_key, any_device=True)
        assert (found.config, found.device) == ("A(1)", "cuda:NVIDIA H200")
        assert store.find_winner(ci_key) == "A(1)"
        assert store.winner(replace(ci_key, arch="sm_80"), any_device=True) is None


@pytest.mark.parametrize("lines, fragment", [
    ([], ":1: not a hidetc records file"),
    (["VALID"], ":1: not a hidetc records file"),
    (['{"hidetc_records": 7}'], ":1: records format 7"),
    (['{"hidetc_records": 1}', "{not json"], ":2: not valid JSON"),
    (['{"hidetc_records": 1}', "VALID", '{"template": "x"}'], ":3: field 'task' missing"),
    (['{"hidetc_records": 1}', "VALID", "[1]"], ":3: expected a JSON object"),
])
def test_import_malformed_names_the_line(tmp_path, lines, fragment):
    with _filled(tmp_path / "src.sqlite") as source:
        source.export(tmp_path / "good.jsonl")
    valid = (tmp_path / "good.jsonl").read_text().splitlines()[1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(valid if ln == "VALID" else ln for ln in lines) + "\n")
    with RecordStore(tmp_path / "r.sqlite") as store:
        with pytest.raises(RecordsError) as info:
            store.import_file(bad)
        assert store.entries() == []          # nothing written
    message = str(info.value)
    assert str(bad) + fragment in message and "\n" not in message


def test_bad_winner_and_candidate_in_import(tmp_path):
    with _filled(tmp_path / "src.sqlite") as source:
        source.export(tmp_path / "good.jsonl")
    header, first, *_ = (tmp_path / "good.jsonl").read_text().splitlines()
    for change, fragment in [({"winner": "nope"}, "the winner is not among"),
                             ({"candidates": [{"config": 1}]}, "a candidate is not")]:
        entry = {**json.loads(first), **change}
        bad = tmp_path / "bad.jsonl"
        bad.write_text(f"{header}\n{json.dumps(entry)}\n")
        with RecordStore(tmp_path / "r.sqlite") as store, \
                pytest.raises(RecordsError, match=f":2: {fragment}"):
            store.import_file(bad)


def test_not_a_store_and_newer_schema(tmp_path):
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(RecordsError, match="not a hidetc records store"):
        RecordStore(junk)
    newer = tmp_path / "newer.sqlite"
    RecordStore(newer).close()
    with sqlite3.connect(newer) as db:
        db.execute("UPDATE meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(RecordsError, match="schema version 99 is newer"):
        RecordStore(newer)
    with pytest.raises(RecordsError, match="no such records file"):
        RecordStore(tmp_path / "missing.sqlite", create=False)


def test_default_path_honours_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("HIDETC_CACHE_DIR", str(tmp_path / "cache"))
    with RecordStore() as store:
        assert store.path == tmp_path / "cache" / "records.sqlite"
    assert cpu_device().startswith("cpu:") and cpu_arch(targets.CPU)


def test_resolve_config_against_the_space():
    template, task, target = TEMPLATES["MatMul"], _matmul(), targets.CPU
    space = list(template.space(task, target))
    chosen = space[len(space) // 2]
    assert resolve_config(template, task, target, repr(chosen)) == chosen
    default = template.default(task, target)
    assert resolve_config(template, task, target, repr(default)) == default
    assert resolve_config(template, task, target, "GemmConfig(mr=99)") is None


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_cli_list_export_import(tmp_path):
    _filled(tmp_path / "gpu.sqlite").close()
    listed = _cli("records", "list", "--records", tmp_path / "gpu.sqlite")
    assert listed.exit_code == 0, listed.output
    assert "3 records" in listed.output and "cuda:NVIDIA H200 sm_90" in listed.output
    assert "winner A(2) 1.5 ms; 2 measured, 1 failed" in listed.output
    as_json = _cli("records", "list", "--json", "--records", tmp_path / "gpu.sqlite")
    assert len(json.loads(as_json.output)) == 3
    exported = _cli("records", "export", tmp_path / "r.jsonl",
                    "--records", tmp_path / "gpu.sqlite")
    assert exported.exit_code == 0 and "exported 3 records" in exported.output
    imported = _cli("records", "import", tmp_path / "r.jsonl",
                    "--records", tmp_path / "ci.sqlite")
    assert imported.exit_code == 0 and "imported 3 records" in imported.output
    with RecordStore(tmp_path / "ci.sqlite") as store:
        assert store.winner(_key(0)) == "A(2)"
    empty = _cli("records", "list", "--records", tmp_path / "none.sqlite")
    assert empty.exit_code == 0 and "0 records" in empty.output


def test_cli_errors_are_one_line(tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"hidetc_records": 1}\n{oops\n')
    result = _cli("records", "import", tmp_path / "bad.jsonl",
                  "--records", tmp_path / "r.sqlite")
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0
    assert "hidetc: error:" in result.output and "bad.jsonl:2: not valid JSON" in result.output
    missing = _cli("records", "export", tmp_path / "x.jsonl",
                   "--records", tmp_path / "missing.sqlite")
    assert missing.exit_code == 2 and "no such records file" in missing.output
