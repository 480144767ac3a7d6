"""Run many cases in isolated, reusable worker processes with per-case timeouts.

What: `run_cases` keeps `jobs` worker processes (`hidetc.tools.conformance.worker`), each in
its own session (process group) with OMP_NUM_THREADS=1 and HIDETC_TUNE=0 unless the
environment sets them, and feeds them cases one at a time. A worker serves case after
case (imports and the loaded backend are paid once); when it dies (a segfault in a
generated kernel, an abort, os._exit) or a case runs past `timeout` seconds, the pool
kills the worker's whole process group (gcc children included), records the case as
"crash" with the signal or exit code, the stage it was in and the tail of the worker's
log, and starts a fresh worker for the next case.
Assumes: the worker answers with the JSON-lines protocol in `worker.py`.
Guarantees: every case gets exactly one result, whatever happens in the worker; the
parent never runs case code itself; workers are gone when `run_cases` returns (or
raises, e.g. on Ctrl-C); the worker logs stay in `log_dir` when one is given (a
temporary one is removed: crash results carry their log's tail). Skipped cases
(`Case.skip_reason`) are not sent to a worker.
"""
from __future__ import annotations

import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Sequence

from hidetc.tools.conformance.cases import Case

LOG_TAIL = 1500


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class WorkerProcess:
    """One worker process, restarted on demand; its stderr appends to `log_path`."""

    def __init__(self, env: dict, log_path: Path):
        self.env, self.log_path = env, log_path
        self.proc: subprocess.Popen | None = None
        self._buffer = b""

    def _start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hidetc.tools.conformance.worker"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=log, env=self.env, start_new_session=True)
        self._buffer = b""

    def kill(self) -> None:
        """Kill the worker's process group (the worker and anything it started)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self.proc = None

    def close(self) -> None:
        """Ask the worker to exit (stdin closed); kill it if it does not."""
        if self.proc is None:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()

    def _readline(self, deadline: float) -> bytes | None:
        """The next protocol line; b"" when the worker died, None at the deadline."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return b""
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _log_tail(self, offset: int) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return text[-LOG_TAIL:]

    def run(self, request: dict, timeout: float) -> dict:
        """Send one request; the worker's result or a crash record."""
        if self.proc is None or self.proc.poll() is not None:
            if self.proc is not None:
                self.kill()
            self._start()
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        deadline = time.monotonic() + timeout
        stage = "start"
        try:
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # it died on its own: reported below as a crash
        while True:
            line = self._readline(deadline)
            if line is None:
                self.kill()
                crash = self._crash(f"timeout after {timeout:g} s (hang?)", stage, offset)
                return {**crash, "seconds": timeout}
            if line == b"":
                code = self.proc.wait()
                how = f"killed by {_signal_name(code)}" if code < 0 else f"exit code {code}"
                self.kill()
                return self._crash(f"worker {how}", stage, offset)
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if "phase" in message:
                stage = message["phase"]
            elif "result" in message:
                return message["result"]

    def _crash(self, what: str, stage: str, offset: int) -> dict:
        return {"status": "crash", "stage": stage, "reason": f"{what} during {stage}",
                "internal": False, "seconds": None, "log": self._log_tail(offset)}


def worker_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("HIDETC_TUNE", "0")
    env.update(extra or {})
    return env


def run_cases(cases: Sequence[Case], *, backend: str = "hidetc", device: str = "CPU",
              jobs: int = 2, timeout: float = 180.0, log_dir: Path | None = None,
              env: dict | None = None,
              progress: Callable[[int, int, dict], None] | None = None) -> list[dict]:
    """Run `cases` on `jobs` workers; one result per case, sorted by name. Each result:
    name, op, status (pass/fail/error/crash/skip), stage, reason, internal, seconds."""
    own_logs = log_dir is None
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="hidetc-conformance-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    lock = threading.Lock()
    total = len(cases)

    def record(case: Case, result: dict) -> None:
        with lock:
            results.append({"name": case.name, "op": case.op, **result})
            if progress is not None:
                progress(len(results), total, results[-1])

    work: queue.Queue[Case] = queue.Queue()
    for case in cases:
        if case.skip_reason:
            record(case, {"status": "skip", "stage": "select", "reason": case.skip_reason,
                          "internal": False, "seconds": 0.0})
        else:
            work.put(case)
    workers = [WorkerProcess(worker_env(env), log_dir / f"worker{k}.log")
               for k in range(max(1, jobs))]
    stop = threading.Event()

    def serve(worker: WorkerProcess) -> None:
        while not stop.is_set():
            try:
                case = work.get_nowait()
            except queue.Empty:
                return
            request = {"case": asdict(case), "backend": backend, "device": device}
            record(case, worker.run(request, timeout))

    threads = [threading.Thread(target=serve, args=(w,), daemon=True) for w in workers]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.5)
    finally:
        stop.set()
        for w in workers:
            w.kill() if any(t.is_alive() for t in threads) else w.close()
        if own_logs:
            shutil.rmtree(log_dir, ignore_errors=True)
    return sorted(results, key=lambda r: r["name"])
