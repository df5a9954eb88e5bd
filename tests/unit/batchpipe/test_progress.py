"""Following a batch: the progress display, the per-custom_id tally, status and batch ids."""

from __future__ import annotations

import io
import json

import pytest

from batchpipe.collect import BatchTally, batch_time, new_batch_id, write_result
from batchpipe.progress import (
    BarProgress,
    LineProgress,
    Progress,
    format_duration,
    make_progress,
)
from worker.wire.messages import ErrorInfo, InferenceResult, Usage


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def result(custom_id: str, batch_id: str = "b", total: int = 3, ok: bool = True) -> InferenceResult:
    return InferenceResult(
        custom_id=custom_id,
        batch_id=batch_id,
        batch_total=total,
        status="completed" if ok else "failed",
        text="answer",
        usage=Usage(prompt_tokens=10, completion_tokens=5, reasoning_tokens=2),
        error=None if ok else ErrorInfo(4003, "too long"),
        metadata={"k": custom_id},
    )


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (42.4, "42s"), (185, "3m05s"), (7620, "2h07m")]
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def test_progress_form_follows_the_stream() -> None:
    assert type(make_progress(io.StringIO(), "b", quiet=True)) is Progress
    assert type(make_progress(Terminal(), "b", quiet=True)) is Progress
    assert isinstance(make_progress(io.StringIO(), "b"), LineProgress)
    assert isinstance(make_progress(Terminal(), "b"), BarProgress)


def test_quiet_progress_writes_nothing() -> None:
    stream = Terminal()
    progress = make_progress(stream, "b", quiet=True)
    progress.update(5, 10)
    progress.close()
    assert stream.getvalue() == ""


def test_plain_lines_are_periodic_and_carry_rate_and_eta() -> None:
    clock, stream = FakeClock(), io.StringIO()
    progress = LineProgress(stream, "batch_1", clock, interval_s=10)
    clock.now += 5
    progress.update(10, 100)
    assert stream.getvalue() == ""
    clock.now += 5
    progress.update(20, 100)
    assert stream.getvalue() == "batch_1: 20/100 (20%) 2.0/s ETA 40s\n"
    clock.now += 1
    progress.update(21, 100)
    assert stream.getvalue().count("\n") == 1
    clock.now += 39
    progress.update(100, 100)
    progress.close()
    lines = stream.getvalue().splitlines()
    assert lines[-1] == "batch_1: 100/100 (100%) 2.0/s in 50s"
    assert "\r" not in stream.getvalue()


def test_bar_redraws_in_place_at_a_bounded_rate() -> None:
    clock, stream = FakeClock(), Terminal()
    bar = BarProgress(stream, "b", clock)
    clock.now += 1
    bar.update(1, 4)
    first = stream.getvalue()
    assert first.startswith("\rb [" + "#" * 7 + "-" * 23 + "] 1/4 (25%) 1.0/s ETA 3s")
    bar.update(2, 4)  # no time passed: not redrawn
    assert stream.getvalue() == first
    clock.now += 1
    bar.update(4, 4)
    assert stream.getvalue().endswith("[" + "#" * 30 + "] 4/4 (100%) 2.0/s in 2s")
    bar.close()
    assert stream.getvalue().endswith("\n")
    assert stream.getvalue().count("\n") == 1


def test_unknown_total_shows_the_count_only() -> None:
    clock = FakeClock()
    progress = Progress(clock)
    clock.now += 2
    progress.update(3, 0)
    assert progress.summary() == "3 answered, 1.5/s"


def test_tally_counts_each_custom_id_once_and_only_its_batch() -> None:
    tally = BatchTally("b")
    assert tally.add(result("r1"))
    assert not tally.add(result("r1"))
    assert not tally.add(result("r2", batch_id="other"))
    assert tally.add(result("r2", ok=False))
    assert (tally.answered, tally.total, tally.complete) == (2, 3, False)
    assert tally.add(result("r3"))
    assert tally.complete
    assert (tally.completed, tally.failed) == (2, 1)
    assert (tally.prompt_tokens, tally.completion_tokens, tally.reasoning_tokens) == (30, 15, 6)


def test_unknown_total_is_never_complete() -> None:
    tally = BatchTally("b")
    tally.add(result("r1", total=0))
    assert not tally.complete


def test_status_state_and_cost() -> None:
    tally = BatchTally("b")
    tally.add(result("r1"))
    running = tally.status(submitted_at=100.0, now=150.0, completion_window_s=60, price_per_1k=None)
    assert (running.state, running.total, running.completed, running.cost) == (
        "in_progress",
        3,
        1,
        None,
    )
    expired = tally.status(submitted_at=100.0, now=161.0, completion_window_s=60, price_per_1k=2)
    assert expired.state == "expired"
    assert expired.cost == pytest.approx(15 / 1000 * 2)
    tally.add(result("r2"))
    tally.add(result("r3"))
    done = tally.status(submitted_at=100.0, now=1e9, completion_window_s=60, price_per_1k=None)
    assert done.state == "completed"
    assert done.to_dict()["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
    assert done.to_dict()["usage"]["total_tokens"] == 45
    fractional = tally.status(
        submitted_at=100.7, now=1e9, completion_window_s=60, price_per_1k=None
    ).to_dict()
    assert fractional["created_at"] == 100 and isinstance(fractional["created_at"], int)


def test_generated_batch_ids_carry_their_submit_time() -> None:
    batch_id = new_batch_id(1_700_000_000.123)
    assert batch_id.startswith("batch_1700000000123_")
    assert batch_time(batch_id) == pytest.approx(1_700_000_000.123)
    assert new_batch_id(1.0) != new_batch_id(1.0)
    assert batch_time("my-batch") is None
    assert batch_time("batch_12_ab") is None


def test_results_go_to_output_or_errors_in_the_openai_shape() -> None:
    output, errors = io.StringIO(), io.StringIO()
    write_result(result("r1"), output, errors)
    write_result(result("r2", ok=False), output, errors)
    ok = json.loads(output.getvalue())
    failed = json.loads(errors.getvalue())
    assert ok["custom_id"] == "r1" and ok["error"] is None
    assert ok["response"]["body"]["choices"][0]["message"]["content"] == "answer"
    assert ok["metadata"] == {"k": "r1"}
    assert failed["custom_id"] == "r2" and failed["error"]["code"] == "4003"
