"""Run a function in several threads at once and collect what they raised."""
from __future__ import annotations

import threading
from typing import Callable


def in_threads(count: int, work: Callable[[int], None]) -> list[BaseException]:
    """`work(k)` for k in range(count), each in a thread of its own, all started before
    any is joined; the exceptions they raised (none: an empty list)."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:  # noqa: BLE001  (handed to the caller)
            errors.append(exc)
    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return errors
