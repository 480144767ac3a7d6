"""The tuning records store: every candidate's measured time (or why it was dropped)
and the winner, per anchor task and machine, in one sqlite3 file.

A record's key (`RecordKey`, `hidetc.driver.tune.keys`) is: the template's name, a
digest of the anchor `Task` (sha256 of its repr, after normalizing attrs and params
with `freeze_attr`, so equal tasks give equal digests in every process), the device
(`cpu:<model>` or `cuda:<GPU name>`), the architecture (`x86-64-avx2`, `sm_90`), the
toolchain version (gcc's or nvcc's version line) and hidetc's version with a digest of the task's
candidate space (`search.space_digest`). Records of another hidetc or toolchain
version, or of another space, are kept but never matched. The task's readable
signature is stored beside the key for listing; it is not part of the key.

Default file: `<cache dir>/records.sqlite` (`HIDETC_CACHE_DIR`, see
`hidetc.backends.toolchain.cache`). Concurrency: WAL journal, a 30 s busy timeout and every
write in one `BEGIN IMMEDIATE` transaction, so processes compiling at once (or a
`records import` during a compile) never corrupt or lose records; a `save` replaces one
key's candidates and winner atomically. Assumes a local file system (WAL needs shared
memory between the processes). The schema is versioned (table `meta`); a store from a
newer hidetc, or a file that is not a store, is a one-line `RecordsError`.

Export/import: JSON Lines, a header line `{"hidetc_records": 1}`, then one object per
key (sorted by key, keys sorted, so the file is stable). Import merges: imported keys
replace the same keys; a malformed file is a `RecordsError` naming the file and line,
and nothing is written. With export/import a GPU-less machine compiles for `sm_90`
with winners measured elsewhere: `lookup(key, any_device=True)` matches every field
but the device and the toolchain.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from hidetc.backends.toolchain.cache import atomic_write, default_cache_dir
from hidetc.compute.task import Task
from hidetc.driver.tune.keys import KEY_FIELDS, RecordKey
from hidetc.errors import RecordsError
from hidetc.schedules.template import Config, Target, Template

SCHEMA_VERSION = 1
EXPORT_FORMAT = 1
BUSY_TIMEOUT_S = 30.0


# ---------------------------------------------------------------- results


@dataclass(frozen=True)
class CandidateResult:
    """One measured config: its repr and time, or why it was dropped (fault, timeout,
    wrong result, build error)."""
    config: str
    time_ms: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class Winner:
    config: str
    time_ms: float | None
    device: str
    measured_at: str


def resolve_config(template: Template, task: Task, target: Target, config_repr: str
                   ) -> Config | None:
    """The config of `template`'s space (or its default) whose repr is `config_repr`;
    None when there is none (a record from another hidetc version)."""
    for config in (*template.space(task, target), template.default(task, target)):
        if repr(config) == config_repr:
            return config
    return None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


# ---------------------------------------------------------------- the store

_KEY_COLS = ", ".join(KEY_FIELDS)
_KEY_MATCH = " AND ".join(f"{f} = ?" for f in KEY_FIELDS)
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS winners (
    {", ".join(f"{f} TEXT NOT NULL" for f in KEY_FIELDS)},
    signature TEXT NOT NULL, config TEXT, time_ms REAL, measured_at TEXT NOT NULL,
    PRIMARY KEY ({_KEY_COLS}));
CREATE TABLE IF NOT EXISTS candidates (
    {", ".join(f"{f} TEXT NOT NULL" for f in KEY_FIELDS)},
    position INTEGER NOT NULL, config TEXT NOT NULL, time_ms REAL, error TEXT,
    measured_at TEXT NOT NULL,
    PRIMARY KEY ({_KEY_COLS}, position));
"""


class RecordStore:
    """The records in one sqlite3 file; see the module docstring. Usable from several
    threads (one connection behind a lock) and several processes at once."""

    def __init__(self, path: Path | str | None = None, create: bool = True):
        self.path = Path(path) if path is not None else self.default_path()
        if not create and not self.path.is_file():
            raise RecordsError(f"{self.path}: no such records file")
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S,
                                       isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise RecordsError(f"{self.path}: cannot open the records store ({exc})") from None
        try:
            self._setup()
        except BaseException:
            self._db.close()
            raise

    @staticmethod
    def default_path() -> Path:
        return default_cache_dir() / "records.sqlite"

    def _setup(self) -> None:
        try:
            self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            self._wal()
            with self._write() as db:
                db.executescript_in_tx(_SCHEMA)
                row = db.execute("SELECT value FROM meta WHERE name = 'schema_version'"
                                 ).fetchone()
                if row is None:
                    db.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                               (str(SCHEMA_VERSION),))
                elif int(row[0]) > SCHEMA_VERSION:
                    raise RecordsError(f"{self.path}: records schema version {row[0]} is "
                                       f"newer than this hidetc's ({SCHEMA_VERSION}); "
                                       "upgrade hidetc or use another --records file")
        except sqlite3.DatabaseError as exc:
            raise RecordsError(f"{self.path}: not a hidetc records store ({exc})") from None

    def _wal(self) -> None:
        """Switch to WAL journaling. Two processes creating the same new store can get
        "database is locked" here at once, without sqlite's busy handler waiting (the
        mode switch needs an exclusive lock the other holds): retry for a while."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                self._db.execute("PRAGMA journal_mode = WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _write(self) -> "_Transaction":
        return _Transaction(self._db, self._lock, self.path)

    def _read(self, sql: str, args: Iterable[Any] = ()) -> list[tuple]:
        with self._lock:
            try:
                return self._db.execute(sql, tuple(args)).fetchall()
            except sqlite3.DatabaseError as exc:
                raise RecordsError(f"{self.path}: cannot read the records ({exc})") from None

    # ------------------------------------------------------------ queries

    def lookup(self, key: RecordKey, any_device: bool = False) -> Winner | None:
        """The winner of `key`; with `any_device`, of any device and toolchain with the
        same template, task, arch and hidetc (key.device's own first, then the latest):
        a config is a template-level choice, so a winner measured with another nvcc
        release still builds and stays correct here."""
        if not any_device:
            rows = self._read(f"SELECT config, time_ms, device, measured_at FROM winners "
                              f"WHERE {_KEY_MATCH} AND config IS NOT NULL", key.columns())
        else:
            fields = [f for f in KEY_FIELDS if f not in ("device", "toolchain")]
            match = " AND ".join(f"{f} = ?" for f in fields)
            rows = self._read(f"SELECT config, time_ms, device, measured_at FROM winners "
                              f"WHERE {match} AND config IS NOT NULL "
                              f"ORDER BY device = ? DESC, measured_at DESC, device",
                              [getattr(key, f) for f in fields] + [key.device])
        return Winner(*rows[0]) if rows else None

    def winner(self, key: RecordKey, any_device: bool = False) -> str | None:
        """The winning config's repr, None when there is no record (or none succeeded)."""
        found = self.lookup(key, any_device)
        return found.config if found else None

    def find_winner(self, key: RecordKey) -> str | None:
        """`winner(key, any_device=True)`: the cross-compile lookup (records imported
        from a machine with the device)."""
        return self.winner(key, any_device=True)

    def candidates(self, key: RecordKey) -> list[CandidateResult]:
        rows = self._read(f"SELECT config, time_ms, error FROM candidates WHERE {_KEY_MATCH} "
                          "ORDER BY position", key.columns())
        return [CandidateResult(*row) for row in rows]

    def entries(self, with_candidates: bool = False) -> list[dict]:
        """One dict per key, sorted by key: the key fields, signature, winner, its time,
        measured_at, and counts `measured` / `failed` (or the `candidates` list). Read
        in one transaction: a consistent snapshot while others write."""
        with self._lock:
            try:
                self._db.execute("BEGIN")
                try:
                    rows = self._db.execute(
                        f"SELECT {_KEY_COLS}, signature, config, time_ms, measured_at "
                        f"FROM winners ORDER BY {_KEY_COLS}").fetchall()
                    cands = self._db.execute(
                        f"SELECT {_KEY_COLS}, config, time_ms, error FROM candidates "
                        f"ORDER BY {_KEY_COLS}, position").fetchall()
                finally:
                    self._db.execute("COMMIT")
            except sqlite3.DatabaseError as exc:
                raise RecordsError(f"{self.path}: cannot read the records ({exc})") from None
        grouped: dict[tuple, list[CandidateResult]] = {}
        for row in cands:
            grouped.setdefault(tuple(row[:6]), []).append(CandidateResult(*row[6:]))
        out = []
        for row in rows:
            entry = dict(zip(KEY_FIELDS, row[:6]))
            entry.update(signature=row[6], winner=row[7], time_ms=row[8], measured_at=row[9])
            results = grouped.get(tuple(row[:6]), [])
            if with_candidates:
                entry["candidates"] = [{"config": c.config, "time_ms": c.time_ms,
                                        "error": c.error} for c in results]
            else:
                entry["measured"] = sum(c.time_ms is not None for c in results)
                entry["failed"] = sum(c.error is not None for c in results)
            out.append(entry)
        return out

    # ------------------------------------------------------------ writes

    def save(self, key: RecordKey, results: Sequence[CandidateResult], winner: str | None,
             measured_at: str | None = None) -> None:
        """Replace `key`'s candidates and winner (None: every candidate failed) at once."""
        self.save_many([(key, list(results), winner, measured_at or _now())])

    def save_many(self, items: Sequence[tuple[RecordKey, Sequence[CandidateResult],
                                              str | None, str]]) -> None:
        """Several `save`s in one transaction: all are written or none."""
        for key, results, winner, _ in items:
            if winner is not None and winner not in {r.config for r in results}:
                raise ValueError(f"winner {winner!r} is not among the candidates")
        with self._write() as db:
            for key, results, winner, measured_at in items:
                cols = key.columns()
                db.execute(f"DELETE FROM candidates WHERE {_KEY_MATCH}", cols)
                db.executemany(
                    f"INSERT INTO candidates VALUES ({', '.join('?' * 11)})",
                    [(*cols, i, r.config, r.time_ms, r.error, measured_at)
                     for i, r in enumerate(results)])
                time_ms = next((r.time_ms for r in results if r.config == winner), None)
                db.execute(f"INSERT OR REPLACE INTO winners VALUES ({', '.join('?' * 10)})",
                           (*cols, key.signature, winner, time_ms, measured_at))

    def export(self, path: Path | str) -> int:
        """Write every entry to `path` (JSON Lines, atomically); returns how many."""
        entries = self.entries(with_candidates=True)
        lines = [json.dumps({"hidetc_records": EXPORT_FORMAT})]
        lines += [json.dumps(e, sort_keys=True) for e in entries]
        try:
            atomic_write(Path(path), "\n".join(lines) + "\n")
        except OSError as exc:
            raise RecordsError(f"{path}: cannot write ({exc.strerror or exc})") from None
        return len(entries)

    def import_file(self, path: Path | str) -> int:
        """Merge the entries of an exported file (they replace the same keys); returns how
        many. The whole file is checked first: a malformed one writes nothing."""
        items = list(_parse_export(Path(path)))
        self.save_many(items)
        return len(items)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> "RecordStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Transaction:
    """`with`: the lock, BEGIN IMMEDIATE (waits up to the busy timeout for other
    writers), COMMIT on success, ROLLBACK on any error."""

    def __init__(self, db: sqlite3.Connection, lock: threading.Lock, path: Path):
        self.db, self.lock, self.path = db, lock, path

    def __enter__(self) -> "_Transaction":
        self.lock.acquire()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException as exc:
            self.lock.release()
            if isinstance(exc, sqlite3.OperationalError):
                raise RecordsError(f"{self.path}: cannot write the records ({exc})") from None
            raise
        return self

    def execute(self, sql: str, args: Iterable[Any] = ()) -> sqlite3.Cursor:
        return self.db.execute(sql, tuple(args))

    def executemany(self, sql: str, rows: Iterable[tuple]) -> None:
        self.db.executemany(sql, rows)

    def executescript_in_tx(self, script: str) -> None:
        for statement in script.split(";"):
            if statement.strip():
                self.db.execute(statement)

    def __exit__(self, kind, exc, tb) -> None:
        try:
            if kind is None:
                self.db.execute("COMMIT")
            else:
                self.db.execute("ROLLBACK")
        except sqlite3.OperationalError as error:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            if kind is None:
                raise RecordsError(f"{self.path}: cannot write the records ({error})"
                                   ) from None
        finally:
            self.lock.release()


# ---------------------------------------------------------------- import parsing

_TEXT_FIELDS = (*KEY_FIELDS, "signature", "measured_at")


def _parse_export(path: Path):
    """Yield (key, results, winner, measured_at) per line of an exported file."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordsError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RecordsError(f"{path}: cannot read ({exc})") from None
    lines = text.splitlines()
    try:
        header = json.loads(lines[0]) if lines else None
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or "hidetc_records" not in header:
        raise RecordsError(f"{path}:1: not a hidetc records file (expected the header "
                           f'{{"hidetc_records": {EXPORT_FORMAT}}})')
    if header["hidetc_records"] != EXPORT_FORMAT:
        raise RecordsError(f"{path}:1: records format {header['hidetc_records']!r} is not "
                           f"supported (this hidetc reads {EXPORT_FORMAT})")
    items = []
    for number, line in enumerate(lines[1:], start=2):
        if line.strip():
            items.append(_entry(path, number, _json_line(path, number, line)))
    return items


def _json_line(path: Path, number: int, line: str) -> Any:
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise RecordsError(f"{path}:{number}: not valid JSON ({exc.msg})") from None


def _entry(path: Path, number: int, obj: Any):
    def bad(what: str) -> RecordsError:
        return RecordsError(f"{path}:{number}: {what}")

    if not isinstance(obj, dict):
        raise bad("expected a JSON object")
    for name in _TEXT_FIELDS:
        if not isinstance(obj.get(name), str):
            raise bad(f"field {name!r} missing or not a string")
    winner, candidates = obj.get("winner"), obj.get("candidates")
    if winner is not None and not isinstance(winner, str):
        raise bad("field 'winner' is not a string or null")
    if not isinstance(candidates, list):
        raise bad("field 'candidates' missing or not a list")
    results = []
    for c in candidates:
        if not (isinstance(c, dict) and isinstance(c.get("config"), str)
                and _optional(c.get("time_ms"), (int, float))
                and _optional(c.get("error"), str)):
            raise bad("a candidate is not {config: str, time_ms: number|null, "
                      "error: str|null}")
        time_ms = float(c["time_ms"]) if c.get("time_ms") is not None else None
        results.append(CandidateResult(c["config"], time_ms, c.get("error")))
    if winner is not None and winner not in {r.config for r in results}:
        raise bad("the winner is not among the candidates")
    key = RecordKey(*(obj[f] for f in KEY_FIELDS), signature=obj["signature"])
    return key, results, winner, obj["measured_at"]


def _optional(value: Any, types) -> bool:
    return value is None or (isinstance(value, types) and not isinstance(value, bool))
