"""What partial results cost: the answer log written, read page by page, and split (issue 50).

No Kafka: the real pieces on a temporary directory.

* ``follower``: the per-answer cost of what the results follower does for each new answer,
  side by side in one run, chunk by chunk (``--chunk`` answers, the order alternating):
  the tally alone (``BatchTally.add``, what it did before the log) and the tally plus the
  log line (``AnswerLog.add``, flushes included). The ``--lines`` answers logged make the
  log the other parts read; one answer in 20 is an error line.
* ``split``: ``AnswerLog.split`` of that log into the final output and error files, per line.
* ``read``: in a fresh process (so that its peak RSS is the reader's alone), the log read
  through the app's own route, ``GET /v1/batches/{id}/partial`` on a FastAPI TestClient over
  the unit tests' in-memory state, in pages of ``--limit`` lines from the first to the last:
  wall time, the process's peak RSS (``VmHWM``) before and after, and ``last=20`` once;
  then the paging functions alone (``page_of`` and the chunked range) under tracemalloc.

    .venv/bin/python -m bench.partial [--lines 1000000] [--limit 10000] [--chunk 10000]

Run by hand under the heavy lock (a minute or so): ``flock /tmp/heavy.lock python -m
bench.partial``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from batchpipe.api.answerlog import AnswerLog, answers_dir
from batchpipe.api.partial import MAX_PAGE_BYTES, _range, page_of
from batchpipe.collect import BatchTally
from bench.common import write_result
from tests.unit.batchpipe.api.fakes import client, services, stored_batch, stored_file, unit_config
from worker.wire.messages import ErrorInfo, InferenceResult, Usage

BATCH = "batch_bench"
ALICE = {"Authorization": "Bearer sk-alice"}  # a key of the unit tests' fakes
ERROR_EVERY = 20


def _results(first: int, count: int, total: int) -> list[InferenceResult]:
    return [
        InferenceResult(
            custom_id=f"request-{i:07d}",
            batch_id=BATCH,
            batch_total=total,
            status="failed" if i % ERROR_EVERY == 0 else "completed",
            text=f"answer {i}",
            usage=Usage(prompt_tokens=3, completion_tokens=2),
            error=ErrorInfo(5001, "engine failed") if i % ERROR_EVERY == 0 else None,
        )
        for i in range(first, first + count)
    ]


def _follower(directory: Path, lines: int, chunk: int) -> tuple[AnswerLog, dict[str, Any]]:
    """Tally alone and tally + log over the same answers, chunk by chunk; the log made."""
    tally = BatchTally(BATCH, lines)
    log = AnswerLog(directory, BATCH, lines)
    spent = {"tally": 0.0, "tally_and_log": 0.0}
    per_chunk: dict[str, list[float]] = {"tally": [], "tally_and_log": []}
    for number, first in enumerate(range(0, lines, chunk)):
        results = _results(first, min(chunk, lines - first), lines)
        arms = [("tally", tally.add), ("tally_and_log", log.add)]
        for name, add in arms if number % 2 == 0 else arms[::-1]:
            start = time.perf_counter()
            for result in results:
                add(result)
            if name == "tally_and_log":
                log.flush()  # the follower flushes at the end of every read step
            took = time.perf_counter() - start
            spent[name] += took
            per_chunk[name].append(1e6 * took / len(results))
    assert tally.complete and log.tally.complete
    us = {name: 1e6 * s / lines for name, s in spent.items()}
    return log, {
        "answers": lines,
        "chunk": chunk,
        "tally_us_per_answer": round(us["tally"], 2),
        "tally_and_log_us_per_answer": round(us["tally_and_log"], 2),
        "tally_us_per_answer_median_chunk": round(statistics.median(per_chunk["tally"]), 2),
        "tally_and_log_us_per_answer_median_chunk": round(
            statistics.median(per_chunk["tally_and_log"]), 2
        ),
        "ratio_tally_and_log_to_tally": round(us["tally_and_log"] / us["tally"], 1),
        "log_bytes": log.path.stat().st_size,
    }


def _split(log: AnswerLog, directory: Path) -> dict[str, Any]:
    lines = log.tally.total
    output, errors = directory / "output.jsonl", directory / "errors.jsonl"
    with output.open("wb") as out, errors.open("wb") as err:
        start = time.perf_counter()
        log.split(out, err)
        took = time.perf_counter() - start
    assert output.stat().st_size + errors.stat().st_size == log.path.stat().st_size
    return {
        "lines": lines,
        "seconds": round(took, 2),
        "us_per_line": round(1e6 * took / lines, 2),
        "output_bytes": output.stat().st_size,
        "error_bytes": errors.stat().st_size,
    }


def _peak_rss_mib() -> float:
    """This process's peak RSS. ``VmHWM``, not ``ru_maxrss``: Linux carries ``ru_maxrss``
    over an exec, so a process spawned by this one's (a fork, then an exec) would start at
    this one's peak, the answers' tallies included."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def _read(log_file: str, directory: str, limit: int) -> dict[str, Any]:
    """In a fresh process: the log read through the route, then the paging alone."""
    config = unit_config(Path(directory))
    svc = services(config)
    batch = stored_batch(svc, stored_file(svc), status="in_progress")
    logs = answers_dir(config.api)
    logs.mkdir(parents=True)
    path = logs / f"{batch.id}.jsonl"
    shutil.move(log_file, path)
    size = path.stat().st_size
    url = f"/v1/batches/{batch.id}/partial"
    pages = read = lines = 0
    with client(svc) as http:
        rss_before = _peak_rss_mib()
        start = time.perf_counter()
        after = ""
        while True:
            page = http.get(url, params={"after": after, "limit": limit}, headers=ALICE)
            assert page.status_code == 200, page.text
            pages += 1
            read += len(page.content)
            lines += int(page.headers["x-batchpipe-lines"])
            after = page.headers["x-batchpipe-cursor"]
            if page.headers["x-batchpipe-has-more"] != "true":
                break
        took = time.perf_counter() - start
        rss_after = _peak_rss_mib()
        start = time.perf_counter()
        latest = http.get(url, params={"last": 20}, headers=ALICE)
        last_ms = 1000 * (time.perf_counter() - start)
        assert latest.status_code == 200 and latest.headers["x-batchpipe-lines"] == "20"
    assert read == size, (read, size)
    at = 0
    tracemalloc.start()
    try:
        while True:
            log = path.open("rb")
            found = page_of(log, size, at, limit, MAX_PAGE_BYTES)
            assert sum(len(chunk) for chunk in _range(log, found)) == found.end - found.start
            at = found.end
            if not found.has_more:
                break
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {
        "log_bytes": size,
        "lines": lines,
        "limit": limit,
        "pages": pages,
        "seconds": round(took, 2),
        "peak_rss_mib_before": round(rss_before, 1),
        "peak_rss_mib_after": round(rss_after, 1),
        "last_20_ms": round(last_ms, 1),
        "paging_alone_traced_peak_mb": round(peak / 1e6, 2),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--limit", type=int, default=10_000, help="lines a page (1-10,000)")
    parser.add_argument("--chunk", type=int, default=10_000)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-partial-") as tmp:
        root = Path(tmp)
        log, follower = _follower(root / "answers", args.lines, args.chunk)
        split = _split(log, root)
        del log
        spawn = multiprocessing.get_context("spawn")  # a fresh process: its own peak RSS
        with spawn.Pool(1) as pool:
            read = pool.apply(_read, (str(root / "answers" / f"{BATCH}.jsonl"), tmp, args.limit))
    result = {
        "follower": follower,
        "split": split,
        "read": read,
        "command": "flock /tmp/heavy.lock .venv/bin/python -m bench.partial "
        f"--lines {args.lines} --limit {args.limit} --chunk {args.chunk}",
        "notes": "No Kafka: the real answerlog, route and paging code on a temp dir; 2 cores "
        "shared with other agents and a full CI test run going on this machine, so absolute "
        "times are loose, the tally/log ratio (same run, interleaved chunks) less so. "
        "'read' runs in a fresh spawned process over the unit tests' in-memory state; its "
        "peak RSS is /proc/self/status VmHWM (ru_maxrss would carry over the parent's peak "
        "across the spawn's exec); 'after' includes the test client's one page in memory.",
    }
    print(write_result("partial", result))
    return result


if __name__ == "__main__":
    main()
