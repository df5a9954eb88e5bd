"""The scan's guard against a record the broker showed after one it had not shown yet.

Publishers write the pending partition without transactions, so its offsets have no
holes but for records they did not write (control records of a transactional producer
outside batchpipe). A broker that raises a partition's high watermark before it has
stored the record batch at that offset (Tansu's ``produce`` bumps the watermark, then
writes the batch; a transactional write updates its bookkeeping in between) can answer
a fetch with the next batch of another publisher and not the one before it; the
consumer's position then passes the missing record for good, and a batch whose end
marker was passed over waits and is abandoned (``no end marker``), one whose request was
passed over is refused by its marker's count.

So the scan checks that offsets follow each other. At the first hole it stops, and the
scan is sought back to the hole's first offset and reads again; only a hole found again
at the same place, a re-read later, is taken as one the partition really has.

Invariant: every record handed on has an offset one above the record handed on before
it, or the hole between them was read twice.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from confluent_kafka import Message

log = logging.getLogger(__name__)


class GapGuard:
    """Passes the scan's records on in order and says where to read again at a hole."""

    def __init__(self) -> None:
        self._next: int | None = None  # the offset after the last record handed on
        self._suspect: tuple[int, int] | None = None  # a hole read once: [start, end)

    def reset(self, start: int) -> None:
        """A new assignment, scanned from ``start`` (a logical offset, below 0: from
        the first record read). Records read before it and handed on after it (a
        rebalance inside the scan's turn) are either below ``start`` (dropped) or make a
        hole that is read again from ``start``."""
        self._next, self._suspect = (start if start >= 0 else None), None

    def admit(self, records: Sequence[Message]) -> tuple[list[Message], int | None]:
        """The records to index, in offset order, and the offset to read again from
        (None: none); records already handed on (a re-read) are dropped."""
        passed: list[Message] = []
        for m in records:
            offset = m.offset()
            if offset is None:
                continue
            if self._next is not None and offset < self._next:
                continue  # read again after a seek: handed on already
            if self._next is not None and offset > self._next:
                hole = (self._next, offset)
                if hole != self._suspect:
                    self._suspect = hole
                    log.info("feeder: pending offsets %d..%d not read: reading again", *hole)
                    return passed, hole[0]
                log.info("feeder: pending offsets %d..%d hold no record", hole[0], hole[1] - 1)
            self._suspect = None
            self._next = offset + 1
            passed.append(m)
        return passed, None
