"""The tuning farm on a local two-node Ray cluster (`ray.cluster_utils.Cluster`: two
raylets on this machine, each offering this machine's measuring resource): the farm's
winners and kernels are what the local tuner makes from the same records; a node killed
mid-tune costs nothing committed and every job finishes; a driver killed mid-tune and
started again measures only what the records lack. Marked `farm` (`make test-farm`:
needs the `ray` extra)."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import hidetc
import models
from hidetc.driver.tune.keys import cpu_arch
from hidetc.driver.tune.ray_farm import RayFarm, machine_resource, wait_for_nodes
from hidetc.target import detect_cpu

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.farm
ROOT = Path(__file__).resolve().parents[2]
TINY = sorted(models.REGISTRY)


@pytest.fixture()
def cluster():
    from ray.cluster_utils import Cluster
    resource = machine_resource("cpu", cpu_arch(detect_cpu()))
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1,
                                                         "resources": {resource: 1}})
    second = made.add_node(num_cpus=1, resources={resource: 1})
    ray.init(address=made.address, logging_level="ERROR", log_to_driver=False)
    assert wait_for_nodes(ray, resource, 2) == 2
    yield made, second, resource
    ray.shutdown()
    made.shutdown()


def _model(tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.onnx"
    if not path.is_file():
        models.save(models.build(name, tiny=True), path)
    return path


def _compile(path: Path, out: Path, records: Path, measure=None):
    return hidetc.compile_model(path, out, target="cpu", tune=True, space=1,
                                records=str(records), verify=False, measure=measure)


def _store(records: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{records}?mode=ro", uri=True)


def _rows(records: Path) -> set:
    with _store(records) as db:
        return set(db.execute("SELECT template, task, config, time_ms, error FROM "
                              "candidates"))


def _sources(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "kernels" / "src").glob("*.c"))}


def _winners(manifest: dict) -> list:
    return [(k["name"], k.get("template"), str(k.get("config"))) for k in manifest["kernels"]]


def test_farm_of_the_five_tiny_models_equals_the_local_tuner(tmp_path, cluster):
    made, _, _ = cluster
    records = tmp_path / "records.sqlite"
    farm = RayFarm(made.address)
    for name in TINY:
        path = _model(tmp_path, name)
        by_farm = _compile(path, tmp_path / f"{name}.farm", records, farm)
        assert by_farm.manifest["tuning"]["tuned"] > 0, name
        # the local tuner with the same records: every winner found, nothing measured
        local = _compile(path, tmp_path / f"{name}.local", records)
        assert local.manifest["tuning"]["tuned"] == 0, name
        assert _winners(local.manifest) == _winners(by_farm.manifest), name
        assert _sources(tmp_path / f"{name}.local") == _sources(tmp_path / f"{name}.farm"), name
    # both nodes measured, nothing lost, the store intact
    assert len([n for n, row in farm.stats.nodes.items() if row["measured"]]) == 2
    assert farm.stats.lost == 0
    with _store(records) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_node_killed_mid_tune_loses_no_committed_measurement(tmp_path, cluster):
    made, second, resource = cluster
    records = tmp_path / "records.sqlite"
    path = _model(tmp_path, "bert_base")
    seen: list[set] = []
    events: list[str] = []

    def kill_when_half_done() -> None:
        deadline = time.time() + 300
        while time.time() < deadline:
            if records.is_file():
                try:
                    rows = _rows(records)
                except sqlite3.Error:
                    rows = set()
                if len(rows) >= 8:
                    seen.append(rows)
                    made.remove_node(second)
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_when_half_done)
    killer.start()
    farm = RayFarm(made.address, chunk=2, on_event=events.append)
    result = _compile(path, tmp_path / "out", records, farm)
    killer.join()
    assert seen, "the node was never killed (the tune ended first)"
    tuning = result.manifest["tuning"]
    assert tuning["tuned"] == tuning["tasks"] and tuning["failures"] == 0, tuning
    after = _rows(records)
    assert seen[0] <= after, "a committed measurement was lost"
    with _store(records) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        # every key has its winner, and all its candidates measured
        winners = db.execute("SELECT COUNT(*) FROM winners WHERE config IS NOT NULL"
                             ).fetchone()[0]
    assert winners == tuning["tasks"]


DRIVER = """
import sys
sys.path.insert(0, {root!r})
import hidetc
from hidetc.driver.tune.ray_farm import RayFarm
hidetc.compile_model({model!r}, {out!r}, target="cpu", tune=True, space=1,
                     records={records!r}, verify=False, measure=RayFarm({address!r}, chunk=2))
"""


def test_a_restarted_driver_resumes_from_the_records(tmp_path, cluster):
    made, _, _ = cluster
    records = tmp_path / "records.sqlite"
    path = _model(tmp_path, "bert_base")
    script = DRIVER.format(root=str(ROOT), model=str(path), out=str(tmp_path / "first"),
                           records=str(records), address=made.address)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"}
    child = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    committed: set = set()
    while time.time() < deadline and child.poll() is None:
        try:
            committed = _rows(records) if records.is_file() else set()
        except sqlite3.Error:
            committed = set()
        if len(committed) >= 6:
            break
        time.sleep(0.2)
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert committed, "the first driver committed nothing before it was killed"
    farm = RayFarm(made.address, chunk=2)
    result = _compile(path, tmp_path / "second", records, farm)
    assert result.manifest["tuning"]["failures"] == 0
    measured = sum(row["measured"] + row["failed"] for row in farm.stats.nodes.values())
    final = _rows(records)          # every candidate of every task: one row each
    assert committed <= final and len(committed) < len(final)
    # nothing the first driver committed was measured again (more may have landed
    # between the last look and the kill: at most the rest)
    assert measured <= len(final) - len(committed), (measured, len(final), len(committed))
    local = _compile(path, tmp_path / "local", records)
    assert _winners(local.manifest) == _winners(result.manifest)
