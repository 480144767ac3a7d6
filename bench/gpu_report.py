"""What the GPU check (bench/gpu_check.py) says: its results.json gathered per model,
results.md, the one-line progress of each step and the compact summary printed last.

- `collect(doc, step, entry)` files a finished step's figures under the document's
  `models` (model -> precision -> bench/gpu_model.py's record), `peers` (model ->
  "mode precision" -> bench/gpu_peers.py's row) and `cpu` (model -> `hidetc bench` row).
- `ratios(doc)`: per model and precision, hidetc's device ms over each peer's and over
  the fastest, against the target (f16 and bf16 <= 0.8x of the fastest peer of that
  precision -- the bf16 models have no peers yet --, f32 <= 0.9x), with
  the recorded torch.compile figure (bench/results/2026-11-30-h200-peers.json) beside.
- `summary(doc)` stays under SUMMARY_LIMIT characters (the device tool returns the last
  12,000 of the output): one line per step, the model table, the first faults.
"""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDED_PEERS = ROOT / "bench" / "results" / "2026-11-30-h200-peers.json"
TARGET = {"f16": 0.8, "bf16": 0.8, "f32": 0.9}   # hidetc / fastest peer, same precision
PEER_MODES = ("eager", "eager+graph", "eager+graph-cl", "compile")
SUMMARY_LIMIT = 10_000
FINE = ("passed", "skipped", "compiled", "unavailable")   # statuses that are no fault


def recorded_compile_ms() -> dict:
    try:
        return json.loads(RECORDED_PEERS.read_text())["median_ms"]
    except (OSError, ValueError, KeyError):
        return {}


def collect(doc: dict, step: str, entry: dict) -> None:
    figures = entry.get("figures")
    if not isinstance(figures, dict):
        return
    if step.startswith("dynamic"):
        doc["dynamic"] = figures
    elif step == "kernel_ab":
        doc["kernel_ab"] = figures
    elif "model" in figures and "precision" in figures:
        key = figures["precision"] + ("-tuned" if step.startswith("tuned") else "")
        doc.setdefault("models", {}).setdefault(figures["model"], {})[key] = figures
    elif step.startswith("peers"):
        for model, rows in figures.get("rows", {}).items():
            doc.setdefault("peers", {}).setdefault(model, {}).update(rows)
        if figures.get("torch"):
            doc["torch"] = figures["torch"]
    elif step.startswith("cpu_") and figures.get("rows"):
        doc.setdefault("cpu", {})[step[4:]] = {**figures["rows"][0],
                                               "cores": figures.get("cores")}


def ratios(doc: dict) -> dict:
    """model -> precision -> {ms, fastest, fastest_ms, ratio, target, met, per_peer}."""
    out: dict = {}
    for model, precisions in doc.get("models", {}).items():
        peers = doc.get("peers", {}).get(model, {})
        for precision, record in precisions.items():
            base = precision.split("-")[0]
            ours = (record.get("timing") or {}).get("device_ms") \
                if record.get("device") == "gpu" else None
            times = {key: row["median_ms"] for key, row in peers.items()
                     if key.endswith(" " + base) and "median_ms" in row}
            fastest = min(times, key=times.get) if times else None
            ratio = ours / times[fastest] if ours and fastest else None
            out.setdefault(model, {})[precision] = {
                "ms": ours, "fastest": fastest, "fastest_ms": times.get(fastest),
                "ratio": ratio, "target": TARGET[base],
                "met": None if ratio is None else ratio <= TARGET[base],
                "per_peer": {k: ours / v for k, v in times.items()} if ours else {}}
    return out


def _check(record: dict) -> str:
    check = record.get("check") or {}
    if check.get("rel_error") is not None:
        return f"{check['status']} {check['rel_error']:.1e}"
    return record.get("status", "-")


def _ms(value) -> str:
    return f"{value:.3f}" if isinstance(value, (int, float)) else "-"


def model_rows(doc: dict) -> list[list[str]]:
    """One row per (model, precision): the cells of the models table."""
    rat, recorded, rows = ratios(doc), recorded_compile_ms(), []
    for model, precisions in doc.get("models", {}).items():
        peers = doc.get("peers", {}).get(model, {})
        for precision, record in precisions.items():
            base, r = precision.split("-")[0], rat[model][precision]
            timing = record.get("timing") or {}
            graph = {True: "graph", False: "stream"}.get(record.get("graph"), "-")
            cells = [model + (" (tiny)" if record.get("tiny") else ""), precision, _check(record),
                     _ms(timing.get("device_ms")), graph, str(record.get("launches", "-"))]
            for mode in PEER_MODES:
                row = peers.get(f"{mode} {base}")
                cells.append(_ms(row.get("median_ms")) if row and "median_ms" in row else
                             ("skip" if row and "skipped" in row else "fail" if row else "-"))
            cells.append(_ms(recorded.get(model)) if base == "f16" else "-")
            cells.append(f"{r['ratio']:.2f}" if r["ratio"] else "-")
            cells.append({True: "yes", False: "NO", None: "-"}[r["met"]] +
                         f" (<= {r['target']})")
            rows.append(cells)
    return rows


MODEL_HEAD = ["model", "prec", "check (rel err)", "hidetc ms", "replay", "launches",
              *PEER_MODES, "recorded compile", "hidetc/fastest", "target met"]


def faults(doc: dict, limit: int = 8) -> list[str]:
    """The first problems, one line each: failing steps, model errors, failed tests."""
    lines = []
    for name, entry in doc.get("steps", {}).items():
        figures = entry.get("figures") if isinstance(entry.get("figures"), dict) else {}
        if entry["status"] in FINE:
            continue
        detail = figures.get("error") or "; ".join(figures.get("failures", [])[:2]) or \
            entry.get("reason") or " / ".join(entry.get("tail", [])[-2:])
        lines.append(f"{name} {entry['status']}: {str(detail)[:300]}")
    return lines[:limit]


def top_kernels(record: dict, count: int) -> list[str]:
    prof = record.get("profile") or {}
    total = prof.get("total_ms") or 0.0
    lines = []
    for row in (prof.get("top") or [])[:count]:
        share = f"{100 * row['ms'] / total:4.1f}%" if total else ""
        estimate = (f" (model {row['estimate_us']:.1f} us)"
                    if row.get("estimate_us") is not None else "")
        lines.append(f"{row['ms']:.4f} ms {share}{estimate} {row['op']} grid {row.get('grid')} "
                     f"block {row.get('block')} {row.get('template') or 'rule'} "
                     f"{row.get('config') or ''}".rstrip())
    return lines


def device_line(doc: dict) -> str:
    dev = ((doc.get("steps", {}).get("device") or {}).get("figures") or {})
    if dev.get("status") == "passed":
        cap = ".".join(map(str, dev.get("capability", [])))
        return (f"{dev.get('name')} (cc {cap}, {dev.get('sms')} SMs, {dev.get('memory_gib')} GiB, "
                f"driver {dev.get('driver')}, SM clock {dev.get('sm_clock_mhz')} MHz, "
                f"{dev.get('host_cores')} host cores)")
    return f"no GPU: {doc.get('device_note') or dev.get('reason') or '?'}; steps ran on " \
           f"{doc.get('device', '?')}"


def progress_line(name: str, entry: dict) -> str:
    figures = entry.get("figures") if isinstance(entry.get("figures"), dict) else {}
    bits = [f"[{name}] {entry['status']} {entry.get('seconds', 0)}s"]
    if entry.get("reason"):
        bits.append(entry["reason"])
    if "passed" in figures and "failed" in figures:
        bits.append(f"{figures['passed']} passed, {figures['failed']} failed")
    rows = figures.get("rows")
    if isinstance(rows, list) and rows and "hidetc_ms" in rows[0]:      # a hidetc bench row
        row = rows[0]
        bits.append(f"hidetc {row['hidetc_ms']:.3f} ms" +
                    (f", {row['ratio_onnxruntime']:.2f}x of ORT" if "ratio_onnxruntime" in row
                     else ""))
    timing = figures.get("timing") or {}
    if timing:
        bits.append(f"{timing['device_ms']:.3f} ms ({timing.get('clock')})")
    c_run = figures.get("c_runtime") or {}
    if c_run:
        bits.append("hidetc-run " + (f"error: {c_run.get('error', '')[:120]}" if c_run["rc"] else
                                     f"{c_run.get('median_ms', float('nan')):.3f} ms" +
                                     {True: ", same bits", False: ", DIFFERENT",
                                      None: ""}[c_run.get("identical")]))
    if figures.get("error"):
        bits.append(str(figures["error"])[:200])
    return " | ".join(bits)


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + \
        ["| " + " | ".join(r) + " |" for r in rows]


def cpu_rows(doc: dict) -> list[list[str]]:
    rows = []
    for model, row in doc.get("cpu", {}).items():
        rows.append([model, str(row.get("cores", "-")), _ms(row.get("hidetc_ms")),
                     _ms(row.get("onnxruntime_ms")),
                     f"{row['ratio_onnxruntime']:.2f}" if row.get("ratio_onnxruntime") else "-",
                     str(row.get("check", "-"))])
    return rows


def dynamic_lines(doc: dict) -> list[str]:
    """The dynamic-shapes step's rows: per length, both checks and dynamic/static."""
    d = doc.get("dynamic")
    if not d:
        return []
    lines = [f"dynamic {d.get('model')} {d.get('precision')} seq {d.get('range')} "
             f"({d.get('variants', '?')} variants): {d.get('status')}"]
    for row in d.get("lengths", []):
        ratio = row.get("dynamic_over_static")
        lines.append(f"  seq {row['seq']}: variant {row.get('variant')}, checks "
                     f"{row.get('dynamic_check', {}).get('status')}/"
                     f"{row.get('static_check', {}).get('status')}, dynamic "
                     f"{_ms(row.get('dynamic_ms'))} ms, static {_ms(row.get('static_ms'))} ms"
                     + (f", ratio {ratio:.3f}" if ratio else ""))
    return lines


def kernel_ab_lines(doc: dict) -> list[str]:
    """The kernel A/B step's pairs: each side's check, ms and registers; after/before."""
    lines = []
    for pair in (doc.get("kernel_ab") or {}).get("pairs", []):
        sides = ", ".join(f"{side} {'ok' if f.get('ok') else 'WRONG'} {_ms(f.get('ms'))} ms "
                          f"{f.get('registers') or '?'} regs"
                          for side, f in pair.get("sides", {}).items())
        ratio = pair.get("after_over_before")
        lines.append(f"ab {pair['pair']}: {sides}" + (f"; after/before {ratio:.3f}"
                                                     if ratio else ""))
    return lines


def markdown(doc: dict) -> str:
    lines = [f"# GPU check ({doc.get('mode')}) {doc.get('started', '')}", "",
             f"Device: {device_line(doc)}. torch {doc.get('torch', '-')}. Budget "
             f"{doc.get('budget_s')} s. Median device ms of the forward pass (CUDA events; "
             "on the emulator the CPU's emulation time), batch 1; peers in the same run, "
             "f32 peers with TF32 off; 'recorded compile' is the torch.compile figure of "
             "bench/results/2026-11-30-h200-peers.json (the target's peer).", "",
             "## Steps", ""]
    lines += _table(["step", "status", "seconds", "cap", "note"],
                    [[n, e["status"], str(e.get("seconds", 0)), str(e.get("cap_s", "-")),
                      progress_line(n, e).split(" | ", 1)[1] if " | " in progress_line(n, e)
                      else ""] for n, e in doc.get("steps", {}).items()])
    lines += ["", "## Models", ""] + _table(MODEL_HEAD, model_rows(doc))
    if doc.get("cpu"):
        lines += ["", "## CPU (hidetc bench, --no-tune)", ""] + \
            _table(["model", "cores", "hidetc ms", "ORT ms", "ratio", "check"], cpu_rows(doc))
    for model, precisions in doc.get("models", {}).items():
        for precision, record in precisions.items():
            top = top_kernels(record, 20)
            if top:
                prof = record["profile"]
                model_ms = (f"; the cost model estimated {prof['estimate_ms']:.3f} ms"
                            if prof.get("estimate_ms") else "")
                lines += ["", f"### {model} {precision}: the most expensive launches "
                          f"(of {prof['launches']}, {prof['total_ms']:.3f} ms in all"
                          f"{model_ms})", ""]
                lines += [f"- {t}" for t in top]
    if doc.get("dynamic"):
        lines += ["", "## Dynamic shapes (one artifact for the range vs static ones)", ""] + \
            [f"- {line.strip()}" for line in dynamic_lines(doc)]
    if doc.get("kernel_ab"):
        lines += ["", "## Kernels before and after (issue 41)", ""] + \
            [f"- {line[3:]}" for line in kernel_ab_lines(doc)]
    problems = faults(doc, 50)
    if problems:
        lines += ["", "## Faults and failures", ""] + [f"- {p}" for p in problems]
    return "\n".join(lines) + "\n"


def summary(doc: dict) -> str:
    """The compact text printed last (under SUMMARY_LIMIT characters)."""
    lines = [f"== GPU check ({doc.get('mode')}): {device_line(doc)}",
             f"   {doc.get('finished_s', '?')} s of {doc.get('budget_s')} s"]
    for name, entry in doc.get("steps", {}).items():
        lines.append(progress_line(name, entry)[:160])
    widths = [22, 8, 14, 9, 7, 8, 8, 9, 8, 9, 7, 4]
    head = ["model", "prec", "check", "hidetc", "replay", "eager", "graph", "graph-cl",
            "compile", "recorded", "ratio", "met"]
    lines += ["== models (device ms; ratio = hidetc / fastest peer of the precision)",
              " ".join(f"{h:>{w}}" for h, w in zip(head, widths))]
    for cells in model_rows(doc):
        picked = cells[:5] + cells[6:12] + [cells[12].split()[0]]
        lines.append(" ".join(f"{c[:w]:>{w}}" for c, w in zip(picked, widths)))
    for model, row in doc.get("cpu", {}).items():
        ratio = row.get("ratio_onnxruntime")
        lines.append(f"cpu {model}: hidetc {_ms(row.get('hidetc_ms'))} ms, ORT "
                     f"{_ms(row.get('onnxruntime_ms'))} ms" +
                     (f", ratio {ratio:.2f}" if ratio else ""))
    lines += dynamic_lines(doc)
    lines += [line[:220] for line in kernel_ab_lines(doc)]
    for model, precisions in doc.get("models", {}).items():
        for line in top_kernels(precisions.get("f16") or {}, 3):
            lines.append(f"top {model} f16: {line}"[:180])
    problems = faults(doc)
    if problems:
        lines += ["== first faults"] + [p[:400] for p in problems]
    text = "\n".join(lines)
    return text if len(text) <= SUMMARY_LIMIT else text[:SUMMARY_LIMIT - 40] + "\n[cut]"
