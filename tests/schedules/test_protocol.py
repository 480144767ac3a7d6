"""Both targets' schedule packages provide the one interface the selection and the plan
call (`hidetc.schedules.protocol.ScheduleModule`), with the signatures it declares."""
from __future__ import annotations

import inspect

import pytest
from helpers import targets
from helpers.tasks import matmul_task

from hidetc.compute.task import Task
from hidetc.driver.backend import BACKENDS
from hidetc.graph.ir import TensorType
from hidetc.schedules.protocol import ScheduleModule
from hidetc.schedules.template import base_template


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_schedule_package_follows_the_protocol(kind):
    module = BACKENDS[kind].schedules
    assert isinstance(module, ScheduleModule)
    for name, member in vars(ScheduleModule).items():
        if name.startswith("_") or not callable(member):
            continue
        declared = list(inspect.signature(member).parameters)[1:]       # less self
        assert list(inspect.signature(getattr(module, name)).parameters) == declared, name
    assert isinstance(module.WRITES_IN_PLACE, bool)
    assert module.TEMPLATES and all(hasattr(t, "default") for t in module.TEMPLATES.values())


@pytest.mark.parametrize("kind", sorted(BACKENDS))
def test_anchor_template_gives_kernel_choices_default(kind):
    """The selection's (template, default) is `kernel_choice`'s, the template in the
    form the plan runs it (the cpu's prepacked wrapper for constant weights, unwrapped by
    `base_template`): the package computes the default, the selection never again."""
    module = BACKENDS[kind].schedules
    machine = targets.CPU if kind == "cpu" else targets.CUDA
    half = "float16" if kind == "cuda" else "float32"    # cuda: the gemv template's rows
    for task in (matmul_task((64, 32), (32, 48)), matmul_task((1, 2048), (2048, 1000), half)):
        for weights in (False, True):
            template, default = module.anchor_template(task, weights, machine)
            assert (base_template(template), default) == module.kernel_choice(task, machine)
            assert (template is not base_template(template)) == (kind == "cpu" and weights)
    relu = Task("Relu", (TensorType("float32", (4, 8)),), (TensorType("float32", (4, 8)),),
                (), (None,))
    assert module.anchor_template(relu, True, machine) == (None, None)
