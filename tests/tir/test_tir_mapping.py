"""Task-mapping semantics: tasks_of covers the grid exactly once, emit agrees with it."""
import itertools

import pytest

from hidetc.tir.evaluate import evaluate_expr
from hidetc.tir.ir import Var
from hidetc.tir.mapping import repeat, spatial
from hidetc.tir.printer import format_mapping

MAPPINGS = [
    spatial(16, 8),
    repeat(4, 1),
    spatial(7),
    repeat(3),
    spatial(2, 3, 4),
    repeat(2, 1, 3),
    repeat(4, 1) * spatial(16, 8),
    spatial(16, 8) * repeat(4, 1),
    spatial(2, 2) * repeat(2, 3) * spatial(4, 1),
    repeat(2) * spatial(3) * repeat(5),
    spatial(2, 1, 3) * repeat(1, 2, 2),
    repeat(1, 1) * spatial(1, 1),
    spatial(1, 5) * spatial(3, 1),
    repeat(2, 2) * repeat(3, 1),
]


def grid(shape):
    return list(itertools.product(*(range(e) for e in shape)))


def test_spatial_tasks():
    m = spatial(16, 8)
    assert m.num_workers == 128 and m.task_shape == (16, 8)
    assert m.tasks_of(0) == [(0, 0)]
    assert m.tasks_of(13) == [(1, 5)]
    assert m.tasks_of(127) == [(15, 7)]
    assert m.tasks_of(128) == [] and m.tasks_of(-1) == []


def test_repeat_tasks():
    m = repeat(4, 1)
    assert m.num_workers == 1 and m.task_shape == (4, 1)
    assert m.tasks_of(0) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert m.tasks_of(1) == []


def test_composition_example_from_the_paper():
    m = repeat(4, 1) * spatial(16, 8)
    assert m.num_workers == 128 and m.task_shape == (64, 8)
    assert m.tasks_of(9) == [(1, 1), (17, 1), (33, 1), (49, 1)]


@pytest.mark.parametrize("m", MAPPINGS, ids=format_mapping)
def test_every_task_covered_exactly_once(m):
    seen = [t for w in range(m.num_workers) for t in m.tasks_of(w)]
    assert sorted(seen) == grid(m.task_shape)


def emitted_tasks(m, worker):
    w = Var("w")
    loops, indices = m.emit(w, "p")
    assert len(indices) == len(m.task_shape)
    assert len({lp.var for lp in loops}) == len(loops)
    out = []
    for values in itertools.product(*(range(lp.extent) for lp in loops)):
        env = {w: worker, **{lp.var: v for lp, v in zip(loops, values)}}
        out.append(tuple(evaluate_expr(ix, env) for ix in indices))
    return out


@pytest.mark.parametrize("m", MAPPINGS, ids=format_mapping)
def test_emit_agrees_with_tasks_of(m):
    for worker in range(m.num_workers):
        assert emitted_tasks(m, worker) == m.tasks_of(worker), worker


@pytest.mark.parametrize("bad", [(), (0,), (2, 0), (-1,), (2.0,), ("3",)])
def test_invalid_shapes_raise(bad):
    with pytest.raises(ValueError):
        spatial(*bad)
    with pytest.raises(ValueError):
        repeat(*bad)


def test_rank_mismatch_raises():
    with pytest.raises(ValueError, match="rank"):
        spatial(2) * repeat(2, 2)
    with pytest.raises(ValueError, match="rank"):
        repeat(2, 2, 2) * spatial(2, 2)


def test_format_mapping():
    assert format_mapping(repeat(4, 1) * spatial(16, 8)) == "repeat(4, 1)*spatial(16, 8)"
    m = spatial(2, 2) * repeat(2, 3) * spatial(4, 1)
    assert format_mapping(m) == "spatial(2, 2)*repeat(2, 3)*spatial(4, 1)"
