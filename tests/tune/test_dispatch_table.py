"""The dispatch table of a range compile (`hidetc.driver.dispatch_report`): per anchor
and tuning size, the config the artifact runs, its measured time against the best
measured there, what each other interval's config would lose there (measured for the
table where the short list had not), and the least worst-case loss one config would
have over the range; shown by `hidetc inspect`. Timed by a deterministic fake measurer
(each config's time a function of its tile and the size), so the losses are exact."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import yaml
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import hidetc
from hidetc.driver.tune.records import CandidateResult
from hidetc.tools.cli import main


def _time(config, task) -> float:
    """A fake time preferring tiles of about 8 rows per row of the input."""
    rows = task.inputs[0].shape[0]
    return abs(config.mr * config.nr - 8 * rows) + 1.0 + config.kc / 1000


def fake_measure(task, template, configs, *, target, progress=None):
    return [CandidateResult(repr(c), _time(c, task), None) for c in configs]


def _compile(tmp, space: int, tune: bool = True):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 64])
    w = numpy_helper.from_array(
        np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x], [y],
                              [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, tmp / "mm.onnx")
    out = tmp / f"out{space}{'' if tune else '-records'}"
    hidetc.compile_model(tmp / "mm.onnx", out, target="cpu", dims={"N": "1..64"}, tune=tune,
                         space=space, records=str(tmp / f"records{space}.sqlite"),
                         measure=fake_measure)
    return out


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """Tuned over the whole space at each size: every table config measured everywhere."""
    return _compile(tmp_path_factory.mktemp("table"), space=2)


def test_a_short_list_s_gaps_are_measured_for_the_table(tmp_path):
    """Space 1 measures a different short list at each size: the table's configs that a
    size's list lacked are measured there, so every loss has a value; where another
    interval's config beats the short list's winner, the loss says so."""
    manifest = yaml.safe_load((_compile(tmp_path, space=1) / "manifest.yaml").read_text())
    (row,) = manifest["dynamic"]["dispatch"]
    for a in row["at"]:
        assert a["ms"] is not None and a["loss"] == round(a["ms"] / a["best_ms"] - 1, 4)
        assert all(v is not None for v in a["others"].values())
    assert row["single_config_loss"] is not None


def test_each_size_s_config_against_the_best_measured_there(tuned):
    """At each tuning size: the variant's config, its time, the best time measured there
    (the whole space's, and the table's other configs: the space a size measures is
    pruned by the size, so another interval's config can beat its winner -- the loss
    says by how much), each other interval's config's loss there, and the least worst
    loss one config would have over the range."""
    manifest = yaml.safe_load((tuned / "manifest.yaml").read_text())
    variants = manifest["dynamic"]["variants"]
    (row,) = manifest["dynamic"]["dispatch"]
    assert row["task"] == "MatMul(float32[N,64], float32[64,64]) -> float32[N,64]"
    assert [a["sizes"] for a in row["at"]] == [v["hint"] for v in variants]
    configs = {a["variant"]: a["config"] for a in row["at"]}
    assert len(set(configs.values())) > 1          # the sizes prefer different tiles
    for a in row["at"]:
        assert a["source"] == "tuned" and a["ms"] >= a["best_ms"]
        assert a["loss"] == round(a["ms"] / a["best_ms"] - 1, 4)
        others = {f"v{j}" for j, c in configs.items() if c != a["config"]}
        assert set(a["others"]) == others and all(a["others"][o] is not None for o in others)
    assert row["worst_loss"] == max(a["loss"] for a in row["at"])
    worst = {}
    for k, config in configs.items():
        worst[k] = max(a["loss"] if a["config"] == config else a["others"][f"v{k}"]
                       for a in row["at"])
    assert row["single_config_loss"] == min(worst.values())


def test_a_neighbour_s_winner_is_tuned_and_read_back_from_the_records(tuned):
    """Each interval measures the earlier intervals' winners beside its own space (the
    fake's N=16 prefers N=4's tile, outside the space N=16 prunes to), and a compile
    that reads the records (no tuning) runs the same configs."""
    table = yaml.safe_load((tuned / "manifest.yaml").read_text())["dynamic"]["dispatch"]
    assert all(a["loss"] == 0 for a in table[0]["at"])
    again = _compile(tuned.parent, space=2, tune=False)
    reread = yaml.safe_load((again / "manifest.yaml").read_text())["dynamic"]["dispatch"]
    assert [(a["config"], a["source"]) for a in reread[0]["at"]] == \
        [(a["config"], "records") for a in table[0]["at"]]


def test_inspect_says_the_table_s_losses(tuned):
    result = CliRunner().invoke(main, ["inspect", str(tuned)])
    assert result.exit_code == 0, result.output
    assert "dispatch: 1 anchor signature(s); loss against the best config measured at each " \
           "tuning size: at most " in result.output
    assert "; one config for the whole range would lose up to " in result.output
    assert "MatMul(float32[N,64], float32[64,64]) -> float32[N,64] x1" in result.output


def test_untuned_tables_say_what_was_not_measured(tmp_path, tuned):
    out = tmp_path / "out"
    hidetc.compile_model(tuned.parent / "mm.onnx", out, target="cpu", dims={"N": "1..64"},
                         tune=False, records=str(tmp_path / "empty.sqlite"))
    (row,) = yaml.safe_load((out / "manifest.yaml").read_text())["dynamic"]["dispatch"]
    assert all(a["source"] == "default" and a["loss"] is None for a in row["at"])
    result = CliRunner().invoke(main, ["inspect", str(out)])
    assert "not every config was measured" in result.output


def _close_times(task, template, configs, *, target, progress=None):
    """Every config within 1% of every other, the tile of about 8 rows per row the
    fastest: each size has its own winner, none worth a second copy of the weights."""
    rows = task.inputs[0].shape[0]
    return [CandidateResult(repr(c), 1.0 + 0.01 * abs(c.mr * c.nr - 8 * rows)
                            / (c.mr * c.nr + 8 * rows), None) for c in configs]


def test_an_earlier_interval_s_config_within_3_percent_is_kept(tmp_path):
    """Where an earlier interval's config is within KEEP_SLACK of a size's best, the
    size runs it: one kernel and one packed copy of the weight for the intervals over
    the range, the table's loss at most 3%."""
    tmp = tmp_path
    _compile(tmp, space=2)            # writes mm.onnx (its own records: unused here)
    out = tmp / "kept"
    hidetc.compile_model(tmp / "mm.onnx", out, target="cpu", dims={"N": "1..64"}, tune=True,
                         space=2, records=str(tmp / "close.sqlite"), measure=_close_times)
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    (row,) = manifest["dynamic"]["dispatch"]
    symbolic = [a for a in row["at"] if not manifest["dynamic"]["variants"][a["variant"]]
                ["static"]]
    assert len(symbolic) >= 2 and len({a["config"] for a in symbolic}) == 1
    assert all(a["loss"] <= 0.03 for a in row["at"])
    packed = [name for name in manifest["weights"]["entries"] if name.startswith("w")]
    assert len(packed) <= 2           # the one-size static cell may pack its own


def test_untuned_intervals_share_one_packing_of_a_weight(tmp_path):
    """A range compile's defaults pack a constant weight one way for every interval (the
    GEMV-like N=1 cell takes the others' panel width): one copy in weights.bin."""
    _compile(tmp_path, space=2)                      # writes mm.onnx
    out = tmp_path / "untuned"
    hidetc.compile_model(tmp_path / "mm.onnx", out, target="cpu", dims={"N": "1..64"},
                         tune=False, records=str(tmp_path / "none.sqlite"))
    manifest = yaml.safe_load((out / "manifest.yaml").read_text())
    assert len(manifest["dynamic"]["variants"]) >= 3
    assert len([n for n in manifest["weights"]["entries"] if n.startswith("w")]) == 1
