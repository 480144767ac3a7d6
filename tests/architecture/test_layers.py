"""The layer order, enforced: every `hidetc` module imports only from its own layer and
the layers below it (DESIGN.md's pipeline; what the README's architecture section
describes). Lowest first:

    base      errors, target (the machine model), cpu_isa (the ISA table)
    graph     graph IR, op catalogue, graph passes, the dtype rules
    frontend  ONNX -> graph
    tir       tensor-program IR, task mappings, intrinsic facts, lowering passes
    compute   what each output element is (operator definitions), the Task
    schedules templates and rules per target, the selection stage
    fusion    partition and graft
    backends  backends.codegen (printers), .toolchain (gcc, nvcc, the object cache),
              .runtime (executors, the emulator, the artifact)
    driver    tune, plan, build, verify, config, the per-target backends, the Python API
    tools     cli, bench, inspect, the ONNX backend adapter, conformance

The check reads the source (`ast`), so a module that imports inside a function to
dodge the order is caught too. The one exemption: the package root (`hidetc/__init__.py`,
the version, base for its importers) is also the API facade whose `__getattr__` loads
`hidetc.driver.api` on first use. The same order is an import-linter contract
(pyproject.toml, `make lint`); `test_the_import_linter_contract_is_kept` runs it here too,
so `make test` (CI) enforces both: this reading of the source names the offending line of
any layer, the contract also follows indirect chains through third modules.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "hidetc"
ORDER = ["base", "graph", "frontend", "tir", "compute", "schedules", "fusion", "backends",
         "driver", "tools"]
LAYER_OF = {
    "errors": "base", "target": "base", "cpu_isa": "base",
    "graph": "graph", "frontend": "frontend", "tir": "tir", "compute": "compute",
    "schedules": "schedules", "fusion": "fusion",
    "backends": "backends",
    "driver": "driver", "tools": "tools",
}


def layer(module: str) -> str | None:
    """The layer of a `hidetc...` module (the longest LAYER_OF prefix); None outside."""
    parts = module.split(".")
    if parts[0] != "hidetc":
        return None
    if len(parts) == 1:
        return "base"         # the package itself: its version
    for n in range(len(parts) - 1, 0, -1):
        hit = LAYER_OF.get(".".join(parts[1:n + 1]))
        if hit:
            return hit
    raise AssertionError(f"{module}: no layer in LAYER_OF (add it there)")


def imported(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:   # `from hidetc import cpu_isa`: the module
                sub = f"{node.module}.{alias.name}"
                is_module = (ROOT.parent / Path(*sub.split("."))).with_suffix(".py").is_file()
                names.append(sub if is_module else node.module)
    return names


def violations() -> list[str]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        module = module.removesuffix(".__init__")
        if module == "hidetc":          # the facade (see the module docstring)
            continue
        here = layer(module)
        for name in imported(ast.parse(path.read_text())):
            there = layer(name)
            if there is not None and ORDER.index(there) > ORDER.index(here):
                out.append(f"{module} ({here}) imports {name} ({there})")
    return sorted(set(out))


def test_imports_follow_the_layer_order():
    assert violations() == []


def test_every_module_has_a_layer():
    for path in ROOT.rglob("*.py"):
        module = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        assert layer(module.removesuffix(".__init__")) in ORDER


def test_the_import_linter_contract_is_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT.parent, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "1 kept, 0 broken" in done.stdout
