"""The results reader re-reads only what a new batch needs (issue 24, found by reading):
the lifecycle used to re-read the results topic from the oldest unfinished batch's submit
time whenever a batch appeared. Measured on a large topic by ``reread.py``."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from batchpipe.api.follow import ResultsFollower
from batchpipe.collect import new_batch_id
from tests.integration.api.reread import at_end_after, batch, follow_until, write_results
from worker.config import Config

pytestmark = pytest.mark.integration

OLD_RESULTS, NEW_RESULTS = 600, 7


def test_a_batch_seen_late_is_counted_from_its_submit_time_only(
    kafka_config: Config, tmp_path: Path
) -> None:
    an_hour_ago = time.time() - 3600
    old = batch(new_batch_id(an_hour_ago), OLD_RESULTS + 1)  # never complete
    write_results(kafka_config, old.id, OLD_RESULTS, an_hour_ago, OLD_RESULTS + 1)
    follower = ResultsFollower(kafka_config, tmp_path, clock_skew_s=1.0, mark_every_s=0.2)
    follow_until(follower, [old], OLD_RESULTS)
    at_end_after(follower, [old], idle_s=1.5)  # the reader's mark at the end is 1 s old
    # another replica's batch: submitted now, answered before this replica sees it
    late = batch(new_batch_id(time.time()), NEW_RESULTS)
    write_results(kafka_config, late.id, NEW_RESULTS, time.time(), NEW_RESULTS)
    follow_until(follower, [old], OLD_RESULTS + NEW_RESULTS)  # read past, not counted
    before = follower.records_read
    deadline = time.monotonic() + 60
    while not ((tally := follower.tally(late.id)) and tally.complete):
        assert time.monotonic() < deadline, "the late batch's results were never counted"
        follower.follow([old, late])
    assert follower.records_read - before == NEW_RESULTS  # not the old batch's too
    old_tally = follower.tally(old.id)
    assert old_tally is not None and old_tally.answered == OLD_RESULTS
    # a Kafka error drops the reader: the next one goes on where it stopped
    follower.close()
    read = follower.records_read
    at_end_after(follower, [old, late], idle_s=1.0)
    assert follower.records_read == read
    follower.close()
