"""Newcomers first in the worker loop: a request fed later with a lower virtual tag
(``batchpipe-tag``, written by the feeder, docs/architecture.md §10) runs before the
requests the worker already holds with higher tags; a tag that is not a number leaves its
request in arrival order, answered like any other."""

from __future__ import annotations

from typing import Any

import pytest

from worker.feeder.headers import TAG_HEADER
from worker.wire.codec import encode_request
from worker.wire.messages import InferenceRequest

from .fakes import GatedEngine
from .rig import P0, P1, Rig, loop_config, rig


def feed(r: Rig[Any], custom_id: str, tag: bytes | None) -> None:
    value, headers = encode_request(InferenceRequest(custom_id=custom_id, prompt=custom_id))
    r.broker.append(0, value, [*headers, *([] if tag is None else [(TAG_HEADER, tag)])])


@pytest.mark.parametrize(
    ("tag", "runs_next"),
    [(b"0", True), (b"12.5", True), (b"nan", False), (b"-1", False), (b"9" * 400, False)],
)
def test_a_later_lower_tag_runs_before_the_held_higher_tags(tag: bytes, runs_next: bool) -> None:
    held = [f"large{n}" for n in range(12)]
    with rig(loop_config(prefetch_count=16, max_batch_size=4), GatedEngine()) as r:
        for n, custom_id in enumerate(held):
            feed(r, custom_id, str(100 + 10 * (n // 4)).encode())  # three slices
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: len(r.engine.batches) == 1, "the first batch on the engine")
        r.step_until(lambda: len(r.worker.batcher) == 8, "the other eight held")
        feed(r, "small", tag)
        r.step_until(lambda: len(r.worker.batcher) == 9, "the newcomer admitted")
        r.engine.open()
        r.step_until(lambda: r.settled({*held, "small"}), "every request answered")
        batches = r.engine.batches
        assert batches[0] == tuple(held[:4])
        if runs_next:
            assert batches[1][0] == "small"  # ahead of the eight held before it
        else:
            assert batches[-1][-1] == "small"  # no tag: arrival order, last
        assert sorted(r.answers().values()) == [1] * 13
