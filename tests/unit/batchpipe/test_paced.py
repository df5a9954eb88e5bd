"""batchpipe/paced.py: lines read on a thread, a None whenever none came for idle_s (the
publisher commits then: an open transaction hides other batches, issue 38)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from batchpipe.paced import paced


def test_items_in_order_and_a_none_for_each_pause() -> None:
    go = threading.Event()

    def slow() -> Iterator[int]:
        yield 1
        go.wait(10)  # a slow store
        yield 2

    seen: list[int | None] = []
    for item in paced(slow(), 0.01):
        seen.append(item)
        if item is None:
            go.set()
    assert [i for i in seen if i is not None] == [1, 2]
    assert None in seen and seen[0] == 1


def test_an_error_while_reading_is_raised_to_the_publisher() -> None:
    def failing() -> Iterator[int]:
        yield 1
        raise ValueError("the file changed")

    with pytest.raises(ValueError, match="the file changed"):
        list(paced(failing(), 5.0))


def test_closing_early_stops_the_reading_thread() -> None:
    read: list[int] = []

    def endless() -> Iterator[int]:
        n = 0
        while True:
            read.append(n)
            yield n
            n += 1

    items = paced(endless(), 5.0)
    assert next(items) == 0
    items.close()
    threads = [t for t in threading.enumerate() if t.name == "batchpipe-publish-read"]
    for thread in threads:
        thread.join(5)
    assert not any(t.is_alive() for t in threads)
