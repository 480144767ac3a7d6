"""What differs per target lives in the target's backend (`hidetc/driver/backend.py`),
the machine model (`hidetc/target.py`), the runtime and code generators of
`hidetc/backends/`, and the tools: nowhere else does the compiler compare a target's
name, keep a table keyed by one or look one up in a table (issue 35). An AST scan of
every other module."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "hidetc"
ALLOWED = ("backends/", "tools/", "driver/backend.py", "target.py")
NAMES = frozenset({"cpu", "cuda"})


def _names_in(node: ast.AST) -> bool:
    """A target name as a constant, or inside a tuple/list/set of constants."""
    if isinstance(node, ast.Constant):
        return node.value in NAMES
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_names_in(e) for e in node.elts)
    return False


def offenders(path: Path, base: Path = ROOT.parent) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(
                _names_in(side) for side in (node.left, *node.comparators)):
            found.append(f"{path.relative_to(base)}:{node.lineno}: compares a "
                         f"target name")
        elif isinstance(node, ast.Dict) and any(
                k is not None and _names_in(k) for k in node.keys):
            found.append(f"{path.relative_to(base)}:{node.lineno}: a table keyed "
                         f"by target names")
        elif isinstance(node, ast.Subscript) and _names_in(node.slice) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("get", "pop", "setdefault") and node.args
                and _names_in(node.args[0])):
            found.append(f"{path.relative_to(base)}:{node.lineno}: looks a target "
                         f"name up")
    return found


def test_no_target_name_compared_outside_the_backends():
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if not rel.startswith(ALLOWED):
            found += offenders(path)
    assert not found, "\n".join(found)


def test_the_scan_finds_what_it_looks_for(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('if kind == "cuda":\n    pass\nT = {"cpu": 1}\nok = x in ("a", "cpu")\n'
                       'fine = kind == "cpus"\nt = TABLE["cuda"]\nu = TABLE.get("cpu", 0)\n'
                       'v = TABLE.get(kind)\n')
    assert [line.split(":")[1] for line in offenders(planted, tmp_path)] == \
        ["1", "3", "4", "6", "7"]
