"""The sha256 of every generated kernel source of the five benchmark models: the check
that a refactor of the compiler changed no kernel.

    python bench/source_hashes.py OUT.json [--tiny] [--work DIR]
    python bench/source_hashes.py OUT.json --compare BEFORE.json

Compiles each model for the cpu (this machine's ISA and cores, no tuning: configs from
the records store where it has them, else the defaults -- the same inputs on both sides
of a refactor) and cross-compiles it for cuda (sm_90, f32 and f16), without
verification, and records {model/target: {source file: sha256}} plus each manifest's
kernel list (name, template, config). `--compare` reports every difference and exits 1
when there is one.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hidetc  # noqa: E402
import models  # noqa: E402

VARIANTS = {"cpu": {"target": "cpu"},
            "cuda-f32": {"target": "cuda", "arch": "sm_90"},
            "cuda-f16": {"target": "cuda", "arch": "sm_90", "precision": "f16"}}


def hashes(work: Path, tiny: bool) -> dict:
    found = {}
    for name in sorted(models.REGISTRY):
        path = work / f"{name}.onnx"
        if not path.is_file():
            models.save(models.build(name, tiny=tiny), path)
        for variant, options in VARIANTS.items():
            out = work / f"{name}.{variant}"
            result = hidetc.compile_model(path, out, verify=False, tune=False, **options)
            sources = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                       for p in sorted((out / "kernels" / "src").iterdir())}
            kernels = [[k["name"], k.get("template"), k.get("config")]
                       for k in result.manifest["kernels"]]
            found[f"{name}/{variant}"] = {"sources": sources, "kernels": kernels}
            print(f"{name}/{variant}: {len(sources)} sources", flush=True)
    return found


def differences(before: dict, after: dict) -> list[str]:
    lines = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        if a is None or b is None:
            lines.append(f"{key}: only {'after' if a is None else 'before'}")
            continue
        for part in ("sources", "kernels"):
            if a[part] != b[part]:
                if part == "sources":
                    changed = sorted(f for f in set(a[part]) | set(b[part])
                                     if a[part].get(f) != b[part].get(f))
                    lines.append(f"{key}: {len(changed)} source(s) differ: {changed[:5]}")
                else:
                    lines.append(f"{key}: the kernel list differs")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--work", default="bench-work/source-hashes")
    parser.add_argument("--compare", help="a JSON written before: report the differences")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    found = hashes(work, args.tiny)
    Path(args.out).write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    if args.compare:
        lines = differences(json.loads(Path(args.compare).read_text()), found)
        print("\n".join(lines) or "every kernel source is byte-identical")
        return 1 if lines else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
