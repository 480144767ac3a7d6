"""The ONNX backend test cases, materialized on disk once per onnx version.

Two suites: `node` (one test per op and variant, generated in memory by the installed
onnx) and `models` (the small models onnx ships with their data: its `simple` graphs
and PyTorch's module and operator exports, `pytorch-converted` and `pytorch-operator`,
models nobody here wrote, several at opsets below 7).

What: the installed onnx package generates its node tests in memory
(`onnx.backend.test.loader.load_model_tests(kind="node")`, ~15 s of numpy). `load_cases`
writes them once under `<hidetc cache>/onnx-node-tests/<onnx version>/`: per case a
directory with `model.onnx` (run it by hand: `hidetc compile .../model.onnx`) and
`data.pkl` (the data sets: lists of inputs and expected outputs as numpy arrays,
lists for sequences, None for empty optionals), plus `index.json` describing every
case; later calls read the index only.
Assumes: the cache directory is private to this user (the pickles are our own).
Guarantees: the version directory appears atomically (built beside it, renamed into
place), so concurrent first runs never see half a suite; tolerances are the
official runner's (each TestCase's rtol/atol: 1e-3/1e-7 for every node test).
A case's `op` is its node's op type (domain-qualified outside ai.onnx); an
`_expanded` case (the op's function body) carries the op of the case it expands.
"""
from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import pickle
import re
import shutil
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

import onnx

from hidetc.backends.toolchain.cache import default_cache_dir

INDEX = "index.json"
DEFAULT_DOMAINS = ("", "ai.onnx")
# Cases not run, with the reason (a prefix of the op's domain -> why).
SKIP_DOMAINS = {
    "ai.onnx.preview.training": "training op (gradient/optimizer): outside an inference "
                                "compiler's scope",
}
_EXPANDED = re.compile(r"_expanded(_ver\d+)?$")


@dataclass(frozen=True)
class Case:
    name: str
    op: str                     # the op under test ("Softmax", "ai.onnx.ml.LabelEncoder")
    ops: tuple[str, ...]        # every op type in the model (expanded cases: the body's)
    opset: int                  # the default-domain opset the model imports
    domains: tuple[str, ...]    # every domain the model imports
    expanded: bool
    datasets: int
    rtol: float
    atol: float
    path: str                   # the case's directory

    @property
    def skip_reason(self) -> str | None:
        for domain, why in SKIP_DOMAINS.items():
            if domain in self.domains:
                return why
        return None


SUITES = {"node": ("node",), "models": ("simple", "pytorch-converted", "pytorch-operator")}


def default_root(suite: str = "node") -> Path:
    return default_cache_dir() / f"onnx-{suite}-tests" / onnx.__version__


def _qualified(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in DEFAULT_DOMAINS else f"{node.domain}.{node.op_type}"


def _normalize(value):
    """TensorProto -> ndarray, recursively through sequences; arrays as they are."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, (list, tuple)):
        return [_normalize(v) for v in value]
    return value


def _generate(suite: str) -> list:
    """The installed onnx's test cases of `suite` (its generators print and warn: muted),
    each with its model and data sets in memory (the model suites keep them on disk)."""
    from onnx.backend.test.loader import load_model_tests
    tests = []
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        for kind in SUITES[suite]:
            tests += [_loaded(t) for t in load_model_tests(kind=kind)]
    return tests


def _loaded(test):
    """A TestCase whose model and data sets are read from its model_dir when the loader
    left them on disk."""
    if test.model is not None:
        return test
    root = Path(test.model_dir)
    data = []
    for data_set in sorted(root.glob("test_data_set_*")):
        data.append(tuple([onnx.numpy_helper.to_array(onnx.load_tensor(str(f)))
                           for f in sorted(data_set.glob(f"{part}_*.pb"))]
                          for part in ("input", "output")))
    return dataclasses.replace(test, model=onnx.load(str(root / "model.onnx")),
                               data_sets=data)


def write_case(root: Path, name: str, model: onnx.ModelProto, data_sets: Sequence,
               rtol: float = 1e-3, atol: float = 1e-7, op: str | None = None) -> Case:
    """Write one case under root/name (model.onnx, data.pkl); returns its entry."""
    ops = tuple(dict.fromkeys(_qualified(n) for n in model.graph.node))
    opsets = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    case_dir = Path(root) / name
    case_dir.mkdir(parents=True)
    onnx.save_model(model, str(case_dir / "model.onnx"))
    data = [(_normalize(list(i)), _normalize(list(o))) for i, o in data_sets or ()]
    with open(case_dir / "data.pkl", "wb") as f:
        pickle.dump({"name": name, "rtol": rtol, "atol": atol, "data_sets": data}, f,
                    protocol=pickle.HIGHEST_PROTOCOL)
    return Case(name, op or (ops[0] if ops else "?"), ops, opsets[0] if opsets else 0,
                tuple(sorted({o.domain or "ai.onnx" for o in model.opset_import})),
                bool(_EXPANDED.search(name)), len(data), float(rtol), float(atol),
                str(case_dir))


def _write_suite(root: Path, suite: str) -> None:
    tests = _generate(suite)
    own = {t.name: _qualified(t.model.graph.node[0]) for t in tests
           if len(t.model.graph.node) == 1}
    entries = []
    for test in sorted(tests, key=lambda t: t.name):
        op = own.get(_EXPANDED.sub("", test.name)) if _EXPANDED.search(test.name) else None
        entries.append(write_case(root, test.name, test.model, test.data_sets, test.rtol,
                                  test.atol, op))
    index = [{**asdict(c), "path": os.path.relpath(c.path, root)} for c in entries]
    (root / INDEX).write_text(json.dumps(index, indent=0))


def materialize(root: Path | None = None, suite: str = "node") -> Path:
    """Write the suite under `root` unless it is there; returns `root`."""
    root = Path(root) if root else default_root(suite)
    if (root / INDEX).is_file():
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        _write_suite(staging, suite)
        try:
            os.rename(staging, root)
        except OSError:
            if not (root / INDEX).is_file():  # not a concurrent winner: a real problem
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return root


def load_cases(root: Path | None = None, suite: str = "node") -> list[Case]:
    """Every test case of `suite` (materialized first if needed), sorted by name."""
    root = materialize(root, suite)
    raw = json.loads((root / INDEX).read_text())
    return [Case(**{**c, "ops": tuple(c["ops"]), "domains": tuple(c["domains"]),
                    "path": str(root / c["path"])}) for c in raw]


def load_data(case: Case) -> list[tuple[list, list]]:
    with open(Path(case.path) / "data.pkl", "rb") as f:
        return pickle.load(f)["data_sets"]


def select(cases: Iterable[Case], pattern: str | None = None,
           ops: Sequence[str] | None = None) -> list[Case]:
    """Cases whose name matches the regex `pattern` and whose op is in `ops`."""
    regex = re.compile(pattern) if pattern else None
    wanted = set(ops) if ops is not None else None
    return [c for c in cases if (regex is None or regex.search(c.name))
            and (wanted is None or c.op in wanted)]


def benchmark_ops() -> list[str]:
    """The op types the five benchmark models use (their tiny variants: same op types),
    read from the builders in `models/`."""
    import models
    found: set[str] = set()
    for name in models.REGISTRY:
        found |= {_qualified(n) for n in models.build(name, tiny=True).graph.node}
    return sorted(found)
