"""The template catalogue behind `hidetc inspect --space`: every registered template
appears, every space fits the budget, has distinct configs, and offers the same
configs whatever the shapes (a task only orders them by the cost model and, on the
tensor-core templates, sets each tile's split-K)."""
from __future__ import annotations

from dataclasses import replace

from hidetc.driver.backend import BACKENDS
from hidetc.schedules import cpu, cuda
from hidetc.schedules.catalog import (
    DTYPES,
    format_spaces,
    grouped_templates,
    representative_tasks,
    template_spaces,
)
from hidetc.schedules.template import MAX_SPACE

SETS = [backend.space_set() for backend in BACKENDS.values()]


def test_every_template_is_listed_within_budget():
    rows = template_spaces(SETS)
    names = {(r.target, r.template) for r in rows}
    for kind, registry in (("cpu", cpu.TEMPLATES), ("cuda", cuda.TEMPLATES)):
        for template in registry.values():
            assert (kind, template.name) in names
    assert ("cuda", "cuda.matmul_tc") in names
    for r in rows:
        assert 1 <= r.configs <= MAX_SPACE, r
    text = format_spaces(rows)
    assert "cpu.matmul" in text and f"at most {MAX_SPACE}" in text


def _unsplit(space) -> set[str]:
    """The configs of a space as a set, split-K set aside (the task's choice per tile)."""
    return {repr(replace(c, splits=1)) if hasattr(c, "splits") else repr(c) for c in space}


def test_spaces_are_distinct_and_shape_independent():
    for _, target, registry in SETS:
        for template, ops in grouped_templates(registry).values():
            for precision in getattr(template, "precisions", ("f32",)):
                small = representative_tasks(ops[0], DTYPES[precision])
                big = representative_tasks(ops[0], DTYPES[precision], big=True)
                for variant, task in small.items():
                    space = list(template.space(task, target))
                    assert len(set(space)) == len(space), (template.name, variant)
                    other = list(template.space(big[variant], target))
                    assert _unsplit(space) == _unsplit(other), (template.name, variant)
