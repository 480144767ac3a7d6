"""Both targets' schedule packages provide the one interface the plan and the tuner call
(`hidetc.schedules.protocol.ScheduleModule`), with the signatures it declares."""
from __future__ import annotations

import inspect

import pytest

from hidetc.driver.backend import BACKENDS
from hidetc.schedules.protocol import ScheduleModule


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
