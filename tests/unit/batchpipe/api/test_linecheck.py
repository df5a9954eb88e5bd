"""serve's checks of a batch's lines before publishing (issue 23): a line's priority above
api.max_priority fails the batch naming priority and the cap; lines at or below it run."""

from __future__ import annotations

import json
from pathlib import Path

from batchpipe.api.linecheck import line_problems
from batchpipe.batchfile import FileLimits

_LIMITS = FileLimits()


def _file(tmp_path: Path, priorities: list[int | None], url: str = "/v1/chat/completions") -> Path:
    path = tmp_path / "in.jsonl"
    lines = []
    for n, priority in enumerate(priorities):
        line: dict[str, object] = {
            "custom_id": f"r{n}",
            "method": "POST",
            "url": url,
            "body": {"model": "echo", "messages": [{"role": "user", "content": "hi"}]}
            if url == "/v1/chat/completions"
            else {"model": "echo", "prompt": "hi"},
        }
        if priority is not None:
            line["priority"] = priority
        lines.append(json.dumps(line))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_priority_above_the_cap_is_named_with_its_line_and_the_cap(tmp_path: Path) -> None:
    path = _file(tmp_path, [None, 0, -5, 3, 1])
    problems = line_problems(path, "/v1/chat/completions", _LIMITS, 0)
    assert [(p["line"], p["param"]) for p in problems] == [(4, "priority"), (5, "priority")]
    assert "priority 3 is above this key's cap api.max_priority (0)" in str(problems[0]["message"])
    assert line_problems(path, "/v1/chat/completions", _LIMITS, 3) == []


def test_another_endpoint_is_still_named(tmp_path: Path) -> None:
    path = _file(tmp_path, [None], url="/v1/completions")
    problems = line_problems(path, "/v1/chat/completions", _LIMITS, 0)
    assert [(p["line"], p["param"]) for p in problems] == [(1, "url")]
