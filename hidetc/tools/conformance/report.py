"""Summaries of a conformance run: counts, failure causes, the expected-failure list.

What: `cause(result)` reduces a failure's reason to a groupable cause (file prefix,
node and value names and shapes dropped; e.g. "unsupported ops: Einsum",
"opset 29 is not supported (supported: 1-28)", "wrong values", "crash: killed by
SIGSEGV during run data set 0"); `summary_text` prints the counts and causes ranked by
count; the expected-failure file (YAML: groups of cases with their cause) is read by
`load_expected`, checked against a run by `compare_expected`, and written from a run
by `write_expected` (to review, then commit).
Guarantees: `compare_expected` reports both directions: failures not on the list
(regressions, or cases new to the suite) and listed cases that now pass (the list is
stale: remove them), each with its cause, so the list is kept honest.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Mapping

import yaml

STATUSES = ("pass", "fail", "error", "crash", "skip")
FAILING = ("fail", "error", "crash")

_PREFIXES = re.compile(r"^(compile failed: |run failed: )?([\w.\-]+\.onnx: )?")
_NODE = re.compile(r"node '[^']*' \(([\w.]+)\)")
_UNSUPPORTED = re.compile(r"unsupported ops: (.*)")
_NODE_SUFFIX = re.compile(r" \(node '[^']*'\)")
_SHAPE = re.compile(r"\[[-\d, ?]*\]")
_PAREN_NAME = re.compile(r"\('[^']*'\)")               # output 1 ('mean')
_NAMED = re.compile(r"\b(input|output|value|initializer) '[^']*'")


def cause(result: Mapping) -> str:
    """A failure's cause, stable across cases that fail the same way."""
    status, reason = result["status"], result.get("reason") or ""
    if status == "pass":
        return "pass"
    if status == "skip":
        return f"skip: {reason}"
    if status == "crash":
        return "crash: " + re.sub(r"timeout after [\d.]+ s", "timeout", reason)
    if status == "fail":
        if "incorrect shape" in reason:
            return "wrong output shape"
        if "dtype(" in reason:
            return "wrong output dtype"
        if "Items are not equal" in reason or "Unexpected type" in reason:
            return "wrong number or kind of outputs"
        return "wrong values (beyond rtol/atol)"
    text = _PREFIXES.sub("", reason)
    unsupported = _UNSUPPORTED.match(text)
    if unsupported:
        ops = sorted({op.split(" (node")[0].strip() for op in unsupported.group(1).split("),")})
        return "unsupported ops: " + ", ".join(op.rstrip(")") for op in ops)
    text = _NODE_SUFFIX.sub("", _NODE.sub(r"\1", text))
    text = _SHAPE.sub("[...]", text)
    text = _NAMED.sub(r"\1 '*'", _PAREN_NAME.sub("('*')", text))
    prefix = "internal error: " if result.get("internal") else ""
    return prefix + text


def counts(results: Iterable[Mapping]) -> dict[str, int]:
    found = Counter(r["status"] for r in results)
    return {s: found.get(s, 0) for s in STATUSES}


def ranked_causes(results: Iterable[Mapping]) -> list[tuple[str, int, list[str]]]:
    """(cause, count, ops) of the failing results, most frequent first."""
    groups: dict[str, list[Mapping]] = defaultdict(list)
    for r in results:
        if r["status"] in FAILING:
            groups[cause(r)].append(r)
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [(c, len(rs), sorted({r["op"] for r in rs})) for c, rs in ranked]


def ranked_ops(results: Iterable[Mapping]) -> list[tuple[str, int, int]]:
    """(op, failing, total) per op with failures, most failures first."""
    total, failing = Counter(), Counter()
    for r in results:
        total[r["op"]] += 1
        failing[r["op"]] += r["status"] in FAILING
    return sorted(((op, n, total[op]) for op, n in failing.items() if n),
                  key=lambda t: (-t[1], t[0]))


def counts_line(results: list[Mapping]) -> str:
    c = counts(results)
    internal = sum(1 for r in results if r["status"] == "error" and r.get("internal"))
    parts = [f"{s} {c[s]}" for s in STATUSES]
    if internal:
        parts[2] += f" ({internal} internal)"
    return f"{len(results)} cases: " + ", ".join(parts)


def summary_text(results: list[Mapping], top: int = 40) -> str:
    lines = [counts_line(results), "", "failure causes (cases, ops):"]
    for text, n, ops in ranked_causes(results)[:top]:
        shown = ", ".join(ops[:8]) + (f" (+{len(ops) - 8})" if len(ops) > 8 else "")
        lines.append(f"  {n:5d}  {text}  [{shown}]")
    return "\n".join(lines)


# -- the expected-failure list --------------------------------------------------------

@dataclass
class Comparison:
    unexpected_failures: list[tuple[str, str]] = field(default_factory=list)  # (case, cause)
    unexpected_passes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)   # listed, but not in this onnx's suite

    @property
    def ok(self) -> bool:
        return not self.unexpected_failures and not self.unexpected_passes

    def text(self, limit: int = 60) -> str:
        lines = []
        if self.unexpected_failures:
            lines.append(f"{len(self.unexpected_failures)} failure(s) not on the expected "
                         f"list (regressions, or new cases):")
            lines += [f"  {name}: {why}" for name, why in self.unexpected_failures[:limit]]
        if self.unexpected_passes:
            lines.append(f"{len(self.unexpected_passes)} listed expected failure(s) now "
                         f"pass (remove them from the list):")
            lines += [f"  {name}" for name in self.unexpected_passes[:limit]]
        if self.unknown:
            lines.append(f"note: {len(self.unknown)} listed case(s) are not in the installed "
                         f"onnx's suite")
        return "\n".join(lines) or "the run matches the expected-failure list"


def load_expected(path: str | Path) -> dict[str, str]:
    """case name -> cause, from the YAML list (`groups: [{cause, cases: [...]}]`)."""
    return {name: text for name, (text, _) in load_expected_groups(path).items()}


def load_expected_groups(path: str | Path) -> dict[str, tuple[str, str]]:
    """case name -> (cause, op) from the YAML list; a case's op is its group's only op,
    else "?"."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    listed: dict[str, tuple[str, str]] = {}
    for group in data.get("groups") or ():
        ops = group.get("ops") or []
        for name in group.get("cases") or ():
            listed[str(name)] = (str(group.get("cause", "")), ops[0] if len(ops) == 1 else "?")
    return listed


def compare_expected(results: Iterable[Mapping], expected: Mapping[str, str],
                     suite: Iterable[str] | None = None) -> Comparison:
    """Check a run (possibly a subset) against the list; `suite` = every case name."""
    out = Comparison()
    for r in results:
        if r["status"] in FAILING and r["name"] not in expected:
            out.unexpected_failures.append((r["name"], cause(r)))
        elif r["status"] == "pass" and r["name"] in expected:
            out.unexpected_passes.append(r["name"])
    if suite is not None:
        out.unknown = sorted(set(expected) - set(suite))
    return out


HEADER = """\
# Node tests of the installed onnx that hidetc's compiled CPU path does not pass yet,
# grouped by cause (the first line of the error, normalized; see
# hidetc/tools/conformance/report.py). Written from an actual run by
#   python -m hidetc.tools.conformance --write-expected tests/conformance/expected_failures.yaml
# then reviewed. `make conformance` and tests/conformance/ fail on a failure missing
# from this list (a regression) AND on a listed case that passes (remove it), so the
# list stays honest. Skipped cases (training ops) are not listed. A group's `note` (the
# reviewer's words: why, and what would fix it) survives a rewrite.
"""


def _scalar(value: str) -> str:
    """One YAML scalar on one line (quoted only when YAML needs it)."""
    return yaml.safe_dump(str(value), width=1 << 16, default_style=None).strip().removesuffix(
        "\n...").strip()


def _notes(path: str | Path) -> dict[str, str]:
    """cause -> the reviewer's `note` in an existing list (kept when it is rewritten)."""
    if not Path(path).is_file():
        return {}
    data = yaml.safe_load(Path(path).read_text()) or {}
    return {g["cause"]: g["note"] for g in data.get("groups") or () if g.get("note")}


def write_expected(results: Iterable[Mapping], path: str | Path, onnx_version: str,
                   carried: Mapping[str, tuple[str, str]] | None = None) -> int:
    """Write the failing cases of a run as the expected-failure list; returns how many.
    `carried`: name -> (cause, op) of listed cases this run did not run (kept)."""
    groups: dict[str, list[Mapping]] = defaultdict(list)
    for r in results:
        if r["status"] in FAILING:
            groups[cause(r)].append(r)
    for name, (text, op) in (carried or {}).items():
        groups[text].append({"name": name, "op": op})
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    notes = _notes(path)
    lines = [f"onnx: {_scalar(onnx_version)}", "groups:"]
    for text, rs in ordered:
        lines += [f"- cause: {_scalar(text)}", f"  count: {len(rs)}"]
        if text in notes:
            lines.append(f"  note: {_scalar(notes[text])}")
        ops = sorted({r["op"] for r in rs})
        lines.append("  ops: [" + ", ".join(_scalar(op) for op in ops) + "]")
        lines.append("  cases:")
        lines += [f"  - {_scalar(name)}" for name in sorted(r["name"] for r in rs)]
    text = HEADER + "\n".join(lines) + "\n"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text)
    return sum(len(rs) for rs in groups.values())
