"""An iterable read on a thread, with a pause said out loud (docs/architecture.md §10).

A publisher with fair share writes its batch without a transaction and its end marker
last; the feeder gives up a batch of which nothing came for a while (its publisher died,
docs/architecture.md §10). A publisher waiting for its next line — a slow disk or object
store, a generator that blocks — must still show it is alive, so the lines are read on a
thread and :func:`paced` yields ``None`` whenever none came for ``idle_s``: the publisher
writes a heartbeat when one is due, and goes on waiting.

The lines cross in a list under a condition, not a queue: a queue's hand-over of each line
cost ``submit`` 15 % of its lines a second (``bench/publish.py``). The publisher takes
everything read so far at once and sleeps only when nothing is there; the reader wakes it
only when it adds to an empty list, and waits only while :data:`AHEAD` lines are there.
"""

from __future__ import annotations

import threading
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: lines read ahead of the publisher at most
AHEAD = 1024


@dataclass(frozen=True)
class _Failed:
    error: BaseException


class _Done:
    """The end of the lines."""


def paced(items: Iterable[T], idle_s: float) -> Generator[T | None, None, None]:
    """``items`` in order, read on a thread; ``None`` each time ``idle_s`` passes with no
    item; an exception raised while reading is raised here. Closing the iterator early
    stops the thread at its next item."""
    handed: list[T] = []
    end: list[_Failed | _Done] = []  # what ended the reading, once it ended
    changed = threading.Condition()
    stop = threading.Event()

    def read() -> None:
        ended: _Failed | _Done = _Done()
        try:
            for item in items:
                with changed:
                    while len(handed) >= AHEAD and not stop.is_set():
                        changed.wait()
                    if stop.is_set():
                        return
                    handed.append(item)
                    if len(handed) == 1:
                        changed.notify_all()
        except BaseException as exc:  # handed to the publisher, which raises it
            ended = _Failed(exc)
        with changed:
            end.append(ended)
            changed.notify_all()

    thread = threading.Thread(target=read, name="batchpipe-publish-read", daemon=True)
    thread.start()
    try:
        while True:
            with changed:
                if not handed and not end:
                    changed.wait(idle_s)
                taken = handed[:]
                handed.clear()
                over = end[0] if end and not taken else None
                if taken:
                    changed.notify_all()  # the reader may wait for room
            if taken:
                yield from taken
            elif isinstance(over, _Failed):
                raise over.error
            elif over is not None:
                return
            else:
                yield None
    finally:
        stop.set()
        with changed:
            changed.notify_all()
