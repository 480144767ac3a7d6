"""Guards: what a build planned at hint sizes decided about its symbolic sizes.

Inside `guarded(hint)`, a comparison of symbolic sizes that the ranges (`symbolic.assume`)
leave open is decided at the hint and recorded as a `Guard` (`expr OP 0`): what is built
there is right for every size where all its guards hold, and the dispatch of a dynamic
artifact picks it only there (`hidetc.driver.dynamic`, `hidetc.backends.runtime.sizes`).
Performance heuristics, whose every choice is right at every size (the tiles of a
predicated schedule), read the hint instead (`hint_value`, `current_hint`) and record
nothing. The text of a guard (`str`) is what manifests write and `Guard.parse` reads.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Mapping, Optional

from hidetc.graph.symbolic import DECIDER, Dim, SymbolicError, SymDim, parse

NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<"}


@dataclass(frozen=True)
class Guard:
    """`expr OP 0`, a fact a build decided at its hint sizes and relies on."""
    expr: "SymDim"
    op: str

    def holds(self, sizes: Mapping[str, int]) -> bool:
        value = self.expr.evaluate(sizes)
        return {"<": value < 0, "<=": value <= 0, ">": value > 0, ">=": value >= 0}[self.op]

    def __str__(self) -> str:
        return f"{self.expr} {self.op} 0"

    def display(self) -> str:
        """For people: the constant on the right (`seq >= 16`)."""
        const = dict(self.expr.terms).get((), 0)
        rest = self.expr - const
        return f"{rest} {self.op} {-const}"

    @staticmethod
    def parse(text: str) -> "Guard":
        expr, op, zero = text.rsplit(" ", 2)
        if op not in NEGATED or zero != "0":
            raise ValueError(f"{text!r} is not a guard")
        parsed = parse(expr)
        if not isinstance(parsed, SymDim):
            raise ValueError(f"{text!r} is not a guard on a symbolic size")
        return Guard(parsed, op)


class Guarding:
    """Decides the comparisons the ranges leave open by the sizes `hint`, recording
    each decision as a Guard."""

    def __init__(self, hint: Mapping[str, int]):
        self.hint = dict(hint)
        self.guards: list[Guard] = []

    def decide(self, diff: "SymDim", op: str) -> bool:
        guard = Guard(diff, op)
        result = guard.holds(self.hint)
        guard = guard if result else Guard(diff, NEGATED[op])
        if guard not in self.guards:
            self.guards.append(guard)
        return result


_ACTIVE: contextvars.ContextVar[Optional[Guarding]] = \
    contextvars.ContextVar("active_guarding", default=None)


@contextlib.contextmanager
def guarded(hint: Mapping[str, int]):
    """Inside the block, comparisons the ranges do not decide are decided at `hint`
    and recorded (yields the Guarding)."""
    guarding = Guarding(hint)
    tokens = DECIDER.set(guarding.decide), _ACTIVE.set(guarding)
    try:
        yield guarding
    finally:
        DECIDER.reset(tokens[0])
        _ACTIVE.reset(tokens[1])


def current_hint() -> Optional[dict[str, int]]:
    """The hint sizes of the enclosing `guarded`, else None."""
    guarding = _ACTIVE.get()
    return None if guarding is None else dict(guarding.hint)


def hint_value(value: Dim) -> int:
    """A size as the number a performance heuristic should see: itself when an int, a
    symbolic size at the hint of the enclosing `guarded` (no guard: a heuristic picks
    among choices that are all correct at every size, e.g. the tiles of a predicated
    schedule); SymbolicError outside one."""
    if not isinstance(value, SymDim):
        return int(value)
    hint = current_hint()
    if hint is None:
        raise SymbolicError(f"the size {value} has no hint to plan with")
    return value.evaluate(hint)
