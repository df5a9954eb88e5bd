"""Partial reads: the answer log's order and restarts, the cursor and paging of
``GET /v1/batches/{id}/partial``, and its 4xx answers for bad parameters."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path

import pytest

from batchpipe.api import answerlog, partial
from batchpipe.api.answerlog import AnswerLog, answers_dir, forget, is_error_line
from batchpipe.api.errors import ApiError
from batchpipe.api.partial import MAX_LIMIT, MAX_PAGE_BYTES, _range, cursor, page_of, tail_of
from batchpipe.api.store import CHUNK_BYTES
from batchpipe.collect import result_line
from tests.unit.batchpipe.api.fakes import client, services, stored_batch, stored_file, unit_config
from worker.wire.messages import ErrorInfo, InferenceResult, Usage

ALICE = {"Authorization": "Bearer sk-alice"}


def result(custom_id: str, batch_id: str = "b", ok: bool = True) -> InferenceResult:
    return InferenceResult(
        custom_id=custom_id,
        batch_id=batch_id,
        batch_total=4,
        status="completed" if ok else "failed",
        text=f"answer {custom_id}",
        usage=Usage(prompt_tokens=3, completion_tokens=2),
        error=None if ok else ErrorInfo(5001, "engine failed"),
    )


def log_bytes(*results: InferenceResult) -> bytes:
    return "".join(result_line(r) for r in results).encode()


def test_the_log_keeps_first_answers_in_the_order_read_and_splits_them_in_order(
    tmp_path: Path,
) -> None:
    log = AnswerLog(tmp_path, "b", 4)
    read = [result("c"), result("a", ok=False), result("c", ok=False), result("x", "other")]
    assert [log.add(r) for r in read] == [True, True, False, False]
    log.add(result("b"))
    out, err = io.BytesIO(), io.BytesIO()
    log.split(out, err)
    assert out.getvalue() == log_bytes(result("c"), result("b"))
    assert err.getvalue() == log_bytes(result("a", ok=False))
    assert log.path.read_bytes() == log_bytes(result("c"), result("a", ok=False), result("b"))
    assert (log.tally.completed, log.tally.failed, log.tally.prompt_tokens) == (2, 1, 9)


def test_a_restart_keeps_what_was_logged_and_logs_only_the_new(tmp_path: Path) -> None:
    first = AnswerLog(tmp_path, "b", 4)
    first.add(result("a"))
    first.add(result("b"))
    first.flush()
    with first.path.open("ab") as torn:  # a crash in the middle of the third line
        torn.write(result_line(result("c")).encode()[:15])
    again = AnswerLog(tmp_path, "b", 4)  # the next server: reads the topic again
    for custom_id in ("b", "a", "c", "d"):
        assert again.add(result(custom_id))
    again.flush()
    assert again.path.read_bytes() == log_bytes(*(result(c) for c in "abcd"))
    assert again.tally.complete


def test_lines_are_appended_at_a_flush_or_once_enough_are_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(answerlog, "_HELD_LINES", 3)
    log = AnswerLog(tmp_path, "b", 9)
    log.add(result("a"))
    log.add(result("b"))
    assert log.path.read_bytes() == b""  # held: partial reads see nothing of them yet
    log.add(result("c"))
    assert log.path.read_bytes() == log_bytes(*(result(c) for c in "abc"))
    log.add(result("d"))
    log.flush()
    assert log.path.read_bytes() == log_bytes(*(result(c) for c in "abcd"))


def test_forgetting_a_batch_removes_every_replicas_log_of_it_only(tmp_path: Path) -> None:
    for host, batch in (("a", "b1"), ("b", "b1"), ("a", "b2")):
        (tmp_path / host).mkdir(exist_ok=True)
        (tmp_path / host / f"{batch}.jsonl").write_bytes(b"")
    forget(tmp_path, "b1")
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.jsonl")) == [
        "a/b2.jsonl"
    ]


def test_error_lines_are_told_from_output_lines() -> None:
    assert is_error_line(result_line(result("a", ok=False)).encode())
    assert not is_error_line(result_line(result("a")).encode())


LINES = [result_line(result(f"r{i}")).encode() for i in range(5)]
LOG = b"".join(LINES)


def test_pages_follow_each_other_to_the_end() -> None:
    log, at, read = io.BytesIO(LOG), 0, b""
    sizes = []
    while True:
        found = page_of(log, len(LOG), at, 2, 1 << 20)
        sizes.append(found.lines)
        read += LOG[found.start : found.end]
        at = found.end
        if not found.has_more:
            break
    assert (sizes, read) == ([2, 2, 1], LOG)
    assert page_of(log, len(LOG), len(LOG), 2, 1 << 20).lines == 0


def test_a_page_leaves_out_a_line_still_being_written() -> None:
    written = LOG + LINES[0][:10]
    found = page_of(io.BytesIO(written), len(written), 0, MAX_LIMIT, 1 << 20)
    assert (found.end, found.lines, found.has_more) == (len(LOG), 5, False)


def test_a_page_stops_at_its_byte_bound_but_holds_one_line() -> None:
    found = page_of(io.BytesIO(LOG), len(LOG), 0, MAX_LIMIT, 1)
    assert (found.end, found.lines, found.has_more) == (len(LINES[0]), 1, True)


@pytest.mark.parametrize("chunk", [7, 1 << 20])  # lines across chunks, and within one
def test_the_last_lines_are_found_from_the_end(monkeypatch: pytest.MonkeyPatch, chunk: int) -> None:
    monkeypatch.setattr(partial, "CHUNK_BYTES", chunk)
    written = LOG + LINES[0][:10]  # a line still being written is left out
    for last, want in ((2, LINES[3:]), (5, LINES), (9, LINES)):
        found = tail_of(io.BytesIO(written), len(written), last)
        assert LOG[found.start : found.end] == b"".join(want), last
        assert (found.end, found.lines) == (len(LOG), len(want))
    assert tail_of(io.BytesIO(LINES[0][:10]), 10, 3).end == 0


@pytest.mark.parametrize("bad", ["-1", "abc", "1e3", "٣", "9" * 21])
def test_a_cursor_that_is_not_a_number_is_a_400_naming_after(bad: str) -> None:
    with pytest.raises(ApiError) as raised:
        cursor(bad)
    assert (raised.value.status, raised.value.param) == (400, "after")


@pytest.mark.parametrize("at", [len(LOG) + 1, 3, len(LINES[0]) + 1])
def test_a_cursor_past_the_end_or_inside_a_line_is_a_400_naming_after(at: int) -> None:
    with pytest.raises(ApiError) as raised:
        page_of(io.BytesIO(LOG), len(LOG), at, 2, 1 << 20)
    assert (raised.value.status, raised.value.param) == (400, "after")


def test_the_route_pages_the_log_and_refuses_bad_parameters(tmp_path: Path) -> None:
    config = unit_config(tmp_path)
    svc = services(config)
    batch = stored_batch(svc, stored_file(svc, lines=5), status="in_progress")
    logs = answers_dir(config.api)
    logs.mkdir(parents=True)
    (logs / f"{batch.id}.jsonl").write_bytes(LOG)
    url = f"/v1/batches/{batch.id}/partial"
    with client(svc) as http:
        first = http.get(url, params={"limit": 3}, headers=ALICE)
        assert first.status_code == 200, first.text
        assert first.content == b"".join(LINES[:3])
        assert first.headers["x-batchpipe-has-more"] == "true"
        assert first.headers["x-batchpipe-batch-status"] == "in_progress"
        assert first.headers["x-batchpipe-done"] == "false"
        rest = http.get(url, params={"after": first.headers["x-batchpipe-cursor"]}, headers=ALICE)
        assert rest.content == b"".join(LINES[3:])
        assert rest.headers["x-batchpipe-has-more"] == "false"
        assert [json.loads(line)["custom_id"] for line in rest.content.splitlines()] == [
            "r3",
            "r4",
        ]
        for params, param in (
            ({"limit": 0}, "limit"),
            ({"limit": MAX_LIMIT + 1}, "limit"),
            ({"limit": "many"}, "limit"),
            ({"after": "x"}, "after"),
            ({"after": 5}, "after"),
            ({"after": len(LOG) + 1}, "after"),
            ({"last": 0}, "last"),
            ({"last": 3, "after": 0}, "last"),
        ):
            refused = http.get(url, params=params, headers=ALICE)
            assert refused.status_code == 400, (params, refused.text)
            assert refused.json()["error"]["param"] == param, params
        latest = http.get(url, params={"last": 2}, headers=ALICE)
        assert latest.content == b"".join(LINES[3:])
        assert latest.headers["x-batchpipe-cursor"] == str(len(LOG))
        other = http.get(url, headers={"Authorization": "Bearer sk-bob"})
        assert other.status_code == 404
        missing = http.get("/v1/batches/batch_nope/partial", headers=ALICE)
        assert missing.status_code == 404


def test_paging_a_large_log_holds_a_chunk_or_two_never_the_log(tmp_path: Path) -> None:
    """100,000 lines (about 55 MB) read page by page: what is held at once is a line and
    a chunk or two, never the log (issue 50: a 1,000,000-line batch stays bounded)."""
    line = LINES[0]
    path = tmp_path / "big.jsonl"
    count = 100_000
    with path.open("wb") as big:
        for _ in range(count // 1_000):
            big.write(line * 1_000)
    size = path.stat().st_size
    read = at = 0
    tracemalloc.start()
    try:
        while True:
            log = path.open("rb")
            found = page_of(log, size, at, MAX_LIMIT, MAX_PAGE_BYTES)
            read += sum(len(chunk) for chunk in _range(log, found))
            at = found.end
            if not found.has_more:
                break
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert (read, at) == (size, size)
    assert peak < 3 * CHUNK_BYTES, f"{peak} bytes held to page {size}"
