"""Tuning on a Ray cluster: candidates built as Ray tasks on any CPU node, measured on
actors pinned to the nodes whose machine matches the target (`pip install 'hidetc[ray]'`).

The tuner's two halves (`search.tune`): a *builder* turns candidates into loadable
kernels and a *measurer* times them on a machine of the target's kind. On one machine
both are `search.LocalMeasurer` (a process pool of builders, one measuring worker at a
time); here, `RayFarm` is a farm measurer (`measure_all`, see `search._measure_farm`):

- **Where**: a node offers measurements for a machine kind by a custom resource named by
  the fingerprint the tuning records are keyed by (`machine_resource`: the cpu's ISA,
  its int8/bf16 features and its core count, as `keys.cpu_arch`); `hidetc farm
  resources` prints this machine's, for `ray start --resources`. One measuring actor per
  such node (it holds the node's one unit of the resource, so two measurements never
  share a node's cores); builds are Ray tasks (`num_cpus=1`) anywhere.
- **Build**: a task's candidates are built by the target's builder (`backend.prebuild`)
  into a fresh cache directory on the build node, and its files come back as bytes
  (the Ray object store carries them to the measuring nodes), where the actor puts
  them into its node's build cache before measuring -- the measurer then finds every
  unit built (a node whose compiler differs misses that cache and builds locally:
  slower, the same kernels).
- **Measure**: a task's candidates are cut into chunks of `chunk` configs, each measured
  by `measure_candidates` inside one actor (its worker processes isolate a candidate
  that faults or hangs: it becomes a failed result, the actor lives on). Each chunk's
  results are committed to the records as they land (`commit`).
- **Faults**: an actor lost with its node (or killed) costs its chunk in flight: the
  chunk goes to another live actor, up to `retries` times, then its candidates are
  recorded as failed ("farm: measurer lost N times"). A build lost with its node is
  retried by Ray (`max_retries`). No live measuring actor left: the remaining chunks
  fail with the reason. A driver restarted with the same records measures only what
  they lack (`search._measure_farm`).
- **Observability**: `stats` per measuring node (chunks, candidates measured and
  failed), the build tasks sent, and, per records key, the nodes its results were
  measured on; `progress(label, done, total)` as chunks land.

Assumes: every node runs the same hidetc (and Python) as the driver; the driver owns
the record store (the workers never open it). Decides: chunks are dispatched one per
idle actor (a node measures one chunk at a time), in job order.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from hidetc.backends.toolchain.cache import ENV_CACHE_DIR, atomic_write, default_cache_dir
from hidetc.driver.backend import backend_for, backend_of
from hidetc.driver.tune.measure import measure_candidates, prebuild
from hidetc.driver.tune.records import CandidateResult
from hidetc.driver.tune.search import MeasureJob
from hidetc.errors import ConfigError
from hidetc.target import Target

RESOURCE_PREFIX = "hidetc-machine-"
CHUNK = 4               # configs per measuring call (the unit of loss and of commits)
RETRIES = 3             # chunks re-sent after losing their actor, then failed


def machine_resource(kind: str, arch: str) -> str:
    """The custom resource a node offers to measure for machines of `arch` (the tuning
    records' arch: `keys.cpu_arch`, or a cuda arch) of target `kind`."""
    return RESOURCE_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "_", f"{kind}-{arch}")


def import_ray():
    """The ray module, or a one-line ConfigError saying how to get it."""
    try:
        import ray  # noqa: PLC0415 -- (optional dependency: the `ray` extra)
    except ImportError:
        raise ConfigError("--cluster needs Ray: pip install 'hidetc[ray]'") from None
    return ray


def connect(address: str):
    """`ray.init(address=...)` unless this process is connected already."""
    ray = import_ray()
    if not ray.is_initialized():
        try:
            ray.init(address=address, logging_level="ERROR", log_to_driver=False)
        except Exception as error:      # ray raises ConnectionError, RuntimeError, ...
            raise ConfigError(f"--cluster {address}: cannot connect to the Ray cluster "
                              f"({str(error).splitlines()[0] if str(error) else error})") \
                from None
    return ray


# ---------------------------------------------------------------- work on the nodes


def build_files(kind: str, arch: str, task, template, configs: list, target: Target
                ) -> dict[str, bytes]:
    """The candidates built by `kind`'s builder into a fresh cache root: its files
    (path relative to the root -> bytes). What a build task runs on its node."""
    root = tempfile.mkdtemp(prefix="hidetc-farm-build-")
    before = os.environ.get(ENV_CACHE_DIR)
    os.environ[ENV_CACHE_DIR] = root
    try:
        prebuild([(task, template, configs)], target=target,
                 builder=backend_for(kind).prebuild, jobs=1, arch=arch)
        files = {}
        for path in Path(root).rglob("*"):
            if path.is_file() and not path.name.endswith((".log", ".tmp")):
                files[path.relative_to(root).as_posix()] = path.read_bytes()
        return files
    finally:
        if before is None:
            os.environ.pop(ENV_CACHE_DIR, None)
        else:
            os.environ[ENV_CACHE_DIR] = before
        shutil.rmtree(root, ignore_errors=True)


def install_files(files: dict[str, bytes], root: Optional[Path] = None) -> int:
    """Put built files into this node's build cache (those not there yet); the count."""
    root = root or default_cache_dir()
    added = 0
    for rel, data in files.items():
        path = root / rel
        if ".." in Path(rel).parts or path.is_file():
            continue
        atomic_write(path, data)
        if path.suffix == ".so":
            path.chmod(0o755)
        added += 1
    return added


class MeasureWorker:
    """The measuring actor's body: one per node of the machine kind."""

    def __init__(self, kind: str, arch: str):
        self.kind, self.arch = kind, arch
        self.backend = backend_for(kind)

    def facts(self, target: Target) -> tuple[str, str]:
        """(arch, device) of the records key on this node's machine."""
        return self.backend.record_facts(target, True)

    def node(self) -> str:
        """`ip/node-id` (first 8 hex digits) of the node this actor runs on."""
        context = import_ray().get_runtime_context()
        return f"{import_ray().util.get_node_ip_address()}/{context.get_node_id()[:8]}"

    def measure(self, files: dict[str, bytes], task, template, configs: list, target: Target,
                budget: Optional[float]) -> tuple[str, list[CandidateResult]]:
        install_files(files)
        results = measure_candidates(task, template, configs, target=target,
                                     measurer=self.backend.measure, arch=self.arch,
                                     budget_rtol=budget)
        return self.node(), results


# ---------------------------------------------------------------- the driver side


@dataclass
class _Chunk:
    job: int
    configs: list
    attempts: int = 0


@dataclass
class FarmStats:
    """What the farm did, per measuring node: chunks measured, candidates measured and
    failed; `where[records key]`: the nodes that measured its candidates; `builds`:
    build tasks sent (any node)."""
    nodes: dict[str, dict[str, int]] = field(default_factory=dict)
    where: dict[Any, set] = field(default_factory=dict)
    lost: int = 0              # chunks re-sent after their actor was lost
    builds: int = 0

    def count(self, node: str, what: str, n: int = 1) -> None:
        row = self.nodes.setdefault(node, {"chunks": 0, "measured": 0, "failed": 0})
        row[what] += n


class RayFarm:
    """A farm measurer over a Ray cluster (see the module docstring); `address` is what
    `ray.init(address=...)` takes."""

    def __init__(self, address: str, *, chunk: int = CHUNK, retries: int = RETRIES,
                 on_event: Optional[Callable[[str], None]] = None):
        self.address = address
        self.chunk = max(1, int(chunk))
        self.retries = max(0, int(retries))
        self.stats = FarmStats()
        self.on_event = on_event or (lambda text: None)
        self._ray = None
        self._pools: dict[str, list] = {}      # resource -> its live measuring actors

    def record_facts(self, target: Target, present: bool = False) -> tuple[str, str]:
        """(arch, device) of the records key, as a measuring node sees its machine: the
        device is the farm's (its CPU model, its GPU), not the driver's, which may have
        none (`present` is the driver's and is not used)."""
        ray, backend, arch, resource = self._setting(target)
        actors = self._actors(ray, resource, backend.kind, arch)
        return tuple(ray.get(actors[0].facts.remote(target)))

    def _setting(self, target: Target):
        ray = self._ray = connect(self.address)
        backend = backend_of(target)
        arch = backend.record_facts(target, False)[0]     # (the target's: no device needed)
        return ray, backend, arch, machine_resource(backend.kind, arch)

    def measure_all(self, jobs: Sequence, *, target: Target,
                    commit: Callable[[int, list], None],
                    progress: Optional[Callable[[str, int, int], None]] = None) -> None:
        ray, backend, arch, resource = self._setting(target)
        actors = self._actors(ray, resource, backend.kind, arch)
        build = ray.remote(num_cpus=1, max_retries=3)(build_files)
        builds = {n: build.remote(backend.kind, arch, j.task, j.template, j.configs, target)
                  for n, j in enumerate(jobs) if j.configs}
        self.stats.builds += len(builds)
        queue = deque(_Chunk(n, j.configs[k:k + self.chunk]) for n, j in enumerate(jobs)
                      for k in range(0, len(j.configs), self.chunk))
        total, done = sum(len(c.configs) for c in queue), 0
        running: dict[Any, tuple[Any, _Chunk]] = {}
        idle = list(actors)
        alive = self._pools[resource]
        while queue or running:
            while queue and idle:
                chunk, actor = queue.popleft(), idle.pop()
                job = jobs[chunk.job]
                ref = actor.measure.remote(builds[chunk.job], job.task, job.template,
                                           chunk.configs, target, job.budget)
                running[ref] = (actor, chunk)
            if not running:          # chunks left, no actor alive
                for chunk in queue:
                    commit(chunk.job, [CandidateResult(repr(c), error="farm: no live measuring "
                                                       f"node for {resource}")
                                       for c in chunk.configs])
                break
            ready, _ = ray.wait(list(running), num_returns=1)
            actor, chunk = running.pop(ready[0])
            try:
                node, results = ray.get(ready[0])
            except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError,
                    ray.exceptions.NodeDiedError) as error:
                if actor in alive:
                    alive.remove(actor)
                self._lost(chunk, queue, commit, error)
                continue
            except ray.exceptions.RayTaskError as error:    # the build failed for good
                commit(chunk.job, [CandidateResult(repr(c), error="farm: build: " +
                                                   _first_line(error)) for c in chunk.configs])
                idle.append(actor)
                continue
            idle.append(actor)
            self.stats.count(node, "chunks")
            self.stats.count(node, "measured", sum(r.error is None for r in results))
            self.stats.count(node, "failed", sum(r.error is not None for r in results))
            if jobs[chunk.job].key is not None:
                self.stats.where.setdefault(jobs[chunk.job].key, set()).add(node)
            commit(chunk.job, results)
            done += len(chunk.configs)
            if progress:
                progress(jobs[chunk.job].label, done, total)

    def __call__(self, task, template, configs: Sequence, *, target: Target,
                 progress: Optional[Callable[[int], None]] = None) -> list[CandidateResult]:
        """One task's candidates on the farm, one result per config in order (the plain
        measurer form: what a range compile's dispatch table measures, `measure_missing`)."""
        got: dict[str, CandidateResult] = {}
        job = MeasureJob(task, template, list(configs), None, None, template.name)
        self.measure_all([job], target=target,
                         commit=lambda n, results: got.update({r.config: r for r in results}),
                         progress=(lambda label, done, total: progress(done)) if progress
                         else None)
        return [got.get(repr(c)) or CandidateResult(repr(c), error="farm: not measured")
                for c in configs]

    def _actors(self, ray, resource: str, kind: str, arch: str) -> list:
        """The live measuring actors of `resource`: made once per farm (one per node
        offering it; a GPU each on cuda) and kept for its later calls."""
        if self._pools.get(resource):
            return list(self._pools[resource])
        nodes = [n for n in ray.nodes() if n.get("Alive") and
                 n.get("Resources", {}).get(resource, 0) >= 1]
        if not nodes:
            raise ConfigError(f"no node of the Ray cluster offers {resource}: start the "
                              f"measuring nodes with `ray start --resources "
                              f"'{{\"{resource}\": 1}}'` (`hidetc farm resources` prints it "
                              f"on such a machine)")
        cls = ray.remote(num_cpus=0, num_gpus=backend_for(kind).measuring_gpus,
                         max_restarts=0, resources={resource: 1})(MeasureWorker)
        actors = [cls.remote(kind, arch) for _ in nodes]
        for node in ray.get([a.node.remote() for a in actors]):
            self.stats.count(node, "chunks", 0)
        self._pools[resource] = actors
        return list(actors)

    def _lost(self, chunk: _Chunk, queue: deque, commit, error) -> None:
        """A chunk whose actor died: sent again, or failed after `retries` losses."""
        self.stats.lost += 1
        chunk.attempts += 1
        self.on_event(f"lost a measuring node ({_first_line(error)}); chunk of "
                      f"{len(chunk.configs)} re-sent (attempt {chunk.attempts})")
        if chunk.attempts > self.retries:
            commit(chunk.job, [CandidateResult(repr(c), error=f"farm: measurer lost "
                                               f"{chunk.attempts} times")
                               for c in chunk.configs])
        else:
            queue.appendleft(chunk)


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:200] if text else type(error).__name__


def wait_for_nodes(ray, resource: str, count: int, timeout_s: float = 60.0) -> int:
    """Wait until `count` live nodes offer `resource` (a cluster still starting); the
    count seen."""
    deadline = time.time() + timeout_s
    while True:
        seen = sum(1 for n in ray.nodes() if n.get("Alive") and
                   n.get("Resources", {}).get(resource, 0) >= 1)
        if seen >= count or time.time() > deadline:
            return seen
        time.sleep(0.5)
