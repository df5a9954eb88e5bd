"""An iterable read on a thread, with a pause said out loud (docs/architecture.md §10).

A publisher with fair share writes its batch without a transaction and its end marker
last; the feeder gives up a batch of which nothing came for a while (its publisher died,
docs/architecture.md §10). A publisher waiting for its next line — a slow disk or object
store, a generator that blocks — must still show it is alive, so the lines are read on a
thread and :func:`paced` yields ``None`` whenever none came for ``idle_s``: the publisher
writes a heartbeat when one is due, and goes on waiting.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Generator, Iterable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

#: lines read ahead of the publisher at most
AHEAD = 1024
_PUT_S = 0.1


@dataclass(frozen=True)
class _Failed:
    error: BaseException


class _Done:
    """The end of the lines."""


def paced(items: Iterable[T], idle_s: float) -> Generator[T | None, None, None]:
    """``items`` in order, read on a thread; ``None`` each time ``idle_s`` passes with no
    item; an exception raised while reading is raised here. Closing the iterator early
    stops the thread at its next item."""
    handed: queue.Queue[T | _Failed | _Done] = queue.Queue(maxsize=AHEAD)
    stop = threading.Event()

    def put(item: T | _Failed | _Done) -> bool:
        while not stop.is_set():
            try:
                handed.put(item, timeout=_PUT_S)
                return True
            except queue.Full:
                continue
        return False

    def read() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_Done())
        except BaseException as exc:  # handed to the publisher, which raises it
            put(_Failed(exc))

    thread = threading.Thread(target=read, name="batchpipe-publish-read", daemon=True)
    thread.start()
    try:
        while True:
            try:
                item = handed.get(timeout=idle_s)
            except queue.Empty:
                yield None
                continue
            if isinstance(item, _Done):
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item
    finally:
        stop.set()
