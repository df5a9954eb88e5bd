"""A :class:`~worker.kafka.stable.StableCheck` answering at once from what a test sets."""

from __future__ import annotations

import time
from collections.abc import Collection

from batcher import Partition
from worker.kafka.stable import Answer


class FakeStableCheck:
    """Each question is answered at once: the partitions in :attr:`held` of the topics
    asked about are held. :attr:`asked` counts the questions."""

    def __init__(self) -> None:
        self.held: set[Partition] = set()
        self.asked = 0
        self._out: Answer | None = None

    def ask(self, topics: Collection[str]) -> None:
        if self._out is None:
            self.asked += 1
            held = frozenset(p for p in self.held if p[0] in topics)
            self._out = Answer(time.monotonic(), held)

    def answer(self) -> Answer | None:
        out, self._out = self._out, None
        return out

    def wait(self, timeout_s: float) -> Answer | None:
        return self.answer()

    def close(self) -> None:
        self._out = None
