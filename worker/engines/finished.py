"""Completions waiting for the worker to collect them: what an in-flight engine whose
requests finish on threads of its own (echo in flight, the remote engine) keeps between
``completions()`` calls.

The engine's threads :meth:`Finished.add` under the engine's condition; the worker's
``completions(timeout_s)`` takes everything there, waiting up to ``timeout_s`` for the
first one unless the engine has failed. An aborted key is :meth:`Finished.discard`-ed, so
a completion that beat the abort is never reported.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from worker.engines.base import Completion


class Finished:
    """Completions by key, guarded by the engine's ``cond`` (held by every caller but
    :meth:`take`, which takes it itself)."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self._done: dict[str, Completion] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._done

    def add(self, completion: Completion) -> None:
        self._done[completion.key] = completion
        self._cond.notify_all()

    def discard(self, key: str) -> None:
        self._done.pop(key, None)

    def take(
        self, timeout_s: float, failed: Callable[[], bool], check: Callable[[], None]
    ) -> list[Completion]:
        """Every completion there, after waiting up to ``timeout_s`` for one while none is
        and the engine has not ``failed``; ``check`` raises for a broken engine first."""
        with self._cond:
            if not self._done and timeout_s > 0:
                self._cond.wait_for(lambda: bool(self._done) or failed(), timeout_s)
            check()
            out = list(self._done.values())
            self._done.clear()
            return out
