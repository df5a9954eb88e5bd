"""Batch validation before publishing: every bad line named, file-level Bailian limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from batchpipe.batchfile import (
    BatchFileError,
    FileLimits,
    LineProblem,
    iter_file,
    validate_file,
    validate_requests,
)
from worker.wire.messages import ChatMessage, InferenceRequest


def line(custom_id: str, model: str = "m", url: str = "/v1/chat/completions", **body: Any) -> str:
    payload = {"model": model, "messages": [{"role": "user", "content": f"hi {custom_id}"}]}
    payload.update(body)
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": url,
            "body": payload,
            "metadata": {"row": custom_id},
        }
    )


def write(tmp_path: Path, *lines: str, ending: str = "\n") -> Path:
    path = tmp_path / "batch.jsonl"
    path.write_bytes("".join(item + ending for item in lines).encode())
    return path


def problems(exc: pytest.ExceptionInfo[BatchFileError]) -> list[tuple[int, int]]:
    return [(p.line_no, p.code) for p in exc.value.problems]


def test_valid_file_counts_requests_and_reads_them_back_in_order(tmp_path: Path) -> None:
    path = write(tmp_path, line("a"), "", "   ", line("b"), line("c"), ending="\r\n")
    assert validate_file(path) == 3
    requests = list(iter_file(path))
    assert [r.custom_id for r in requests] == ["a", "b", "c"]
    assert dict(requests[1].metadata) == {"row": "b"}
    assert requests[2].messages == (ChatMessage("user", "hi c"),)


def test_last_line_without_newline_is_read(tmp_path: Path) -> None:
    path = tmp_path / "batch.jsonl"
    path.write_text(line("a") + "\n" + line("b"))
    assert validate_file(path) == 2
    assert [r.custom_id for r in iter_file(path)] == ["a", "b"]


def test_every_bad_line_is_named_with_its_code(tmp_path: Path) -> None:
    limits = FileLimits(max_line_bytes=400)
    path = write(
        tmp_path,
        line("ok"),
        '{"custom_id": "broken", ',
        line("ok"),
        line("big", padding="x" * 500),
        line("emb", url="/v1/embeddings"),
        line("other", model="n"),
        line("fine"),
    )
    with pytest.raises(BatchFileError) as exc:
        validate_file(path, limits)
    assert problems(exc) == [(2, 4001), (3, 4001), (4, 4003), (5, 4002), (6, 4002)]
    text = str(exc.value)
    assert "nothing was published" in text
    assert "line 3: 4001 duplicate custom_id 'ok'" in text
    assert "line 4: 4003" in text
    assert "line 6: 4002 model 'n' differs from 'm' (line 1)" in text


def test_a_line_at_the_limit_passes_and_one_byte_more_does_not(tmp_path: Path) -> None:
    exact = line("a")
    size = len(exact.encode())
    assert validate_file(write(tmp_path, exact), FileLimits(max_line_bytes=size)) == 1
    with pytest.raises(BatchFileError) as exc:
        validate_file(write(tmp_path, exact, line("b")), FileLimits(max_line_bytes=size - 1))
    assert problems(exc) == [(1, 4003), (2, 4003)]


def test_oversize_line_far_over_the_limit_is_skipped_not_read_whole(tmp_path: Path) -> None:
    path = write(tmp_path, line("a"), line("huge", padding="y" * (3 << 20)), line("b"))
    with pytest.raises(BatchFileError) as exc:
        validate_file(path, FileLimits(max_line_bytes=1000))
    assert problems(exc) == [(2, 4003)]
    assert f"{len(line('huge', padding='y' * (3 << 20)))} bytes" in str(exc.value)


def test_too_many_lines_is_reported_at_the_first_line_over(tmp_path: Path) -> None:
    path = write(tmp_path, *(line(str(i)) for i in range(5)))
    assert validate_file(path, FileLimits(max_lines=5)) == 5
    with pytest.raises(BatchFileError) as exc:
        validate_file(path, FileLimits(max_lines=3))
    assert problems(exc) == [(4, 4003)]


def test_file_over_the_size_limit_is_rejected_before_reading(tmp_path: Path) -> None:
    path = write(tmp_path, line("a"), line("b"))
    with pytest.raises(BatchFileError) as exc:
        validate_file(path, FileLimits(max_file_bytes=10))
    assert exc.value.problems == (LineProblem(0, 4003, exc.value.problems[0].message),)
    assert "file: 4003" in str(exc.value)


def test_empty_file_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(BatchFileError) as exc:
        validate_file(write(tmp_path, "", "  "))
    assert problems(exc) == [(0, 4001)]


def test_mixed_models_pass_when_allowed(tmp_path: Path) -> None:
    path = write(tmp_path, line("a", model="m"), line("b", model="n"))
    assert validate_file(path, FileLimits(one_model=False)) == 2


def test_changed_file_between_validation_and_publishing_fails(tmp_path: Path) -> None:
    path = write(tmp_path, line("a"), line("b"))
    assert validate_file(path) == 2
    path.write_text(line("a") + "\nnot json\n")
    with pytest.raises(BatchFileError) as exc:
        list(iter_file(path))
    assert problems(exc) == [(2, 4001)]


def test_in_memory_requests_follow_the_same_rules() -> None:
    good = InferenceRequest(custom_id="x", model="m", messages=(ChatMessage("user", "q"),))
    mapping = json.loads(line("y"))
    assert [r.custom_id for r in validate_requests([good, mapping])] == ["x", "y"]
    bad_value = json.loads(line("t", temperature=5))
    no_input = InferenceRequest(custom_id="z", model="m")
    big = json.loads(line("w", padding="p" * 300))
    with pytest.raises(BatchFileError) as exc:
        validate_requests(
            [good, mapping, good, bad_value, no_input, big], FileLimits(max_line_bytes=300)
        )
    assert problems(exc) == [(3, 4001), (4, 4002), (5, 4002), (6, 4003)]
    assert str(exc.value).startswith("requests: 4 problems")
