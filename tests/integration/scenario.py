"""What every chaos scenario shares: paced workers, requests, and :func:`conclude`.

:func:`conclude` asserts a scenario's guarantees once its faults are over:

- every request answered exactly once in what ``collect`` writes (the real
  :meth:`batchpipe.Client.collect`), or dead-lettered when no ``custom_id`` can be read;
- no repeat on the results topic itself, read read_committed from its start (counted on
  the topic, not after a dedup): none at all, unless the scenario says why the embedded
  broker may show one (``raw_duplicates_because``: it shows aborted records, so a
  SIGKILLed worker's open transaction can be seen; on Apache Kafka, ``KAFKA_BOOTSTRAP``,
  none is allowed anywhere);
- no worker dead unless the test ended it;
- the group's committed offsets at the end of every partition (lag 0) within
  :data:`LAG_BOUND_S` of the last answer;

and adds the scenario's row to the session's report (``BATCHPIPE_CHAOS_REPORT``).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from batchpipe.client import Client
from tests.integration.chaos_report import ChaosReport, ScenarioReport
from tests.integration.fleet import Fleet
from tests.integration.harness import ResultWatcher, read_whole, wait_for_lag_zero
from worker.config import Config
from worker.wire.codec import decode_result
from worker.wire.messages import ChatMessage, InferenceRequest, SamplingParams

#: Seconds from the last answer until the group has committed every partition to its end.
LAG_BOUND_S = 30.0
#: Seconds ``collect`` may take to read a batch whose answers are all written.
COLLECT_BOUND_S = 60.0
#: Seconds a SIGTERMed worker may take beyond its drain timeout to exit.
EXIT_GRACE_S = 20.0
TOKENS = 10  # every answer: the echo engine's reply is longer, max_tokens cuts it here


#: Why a scenario that SIGKILLs a worker may show repeats on the embedded broker's results
#: topic: the killed worker's open transaction is aborted by the next owner of its
#: partitions, who answers those records again, and Tansu shows aborted records to
#: read_committed readers (docs/architecture.md §7); Apache Kafka hides them.
KILLED_ON_TANSU = "a SIGKILLed worker's aborted transaction is visible on the embedded broker"


def paced(config: Config, token_s: float, drain_timeout_s: float = 30.0) -> Config:
    """Six partitions, the echo engine at ``token_s`` seconds a generated token."""
    return replace(
        config,
        kafka=replace(config.kafka, partitions=6),
        engine=replace(config.engine, kind="echo", model="echo", simulated_token_s=token_s),
        worker=replace(config.worker, drain_timeout_s=drain_timeout_s),
    )


def requests(
    n: int, batch_id: str, start: int = 0, total: int | None = None
) -> list[InferenceRequest]:
    """Requests ``r<start>`` … of a batch of ``total`` (default: these ``n``)."""
    return [
        InferenceRequest(
            custom_id=f"r{i}",
            batch_id=batch_id,
            batch_total=total or n,
            messages=(ChatMessage("user", f"chaos request {i:05d}"),),
            sampling=SamplingParams(max_tokens=TOKENS, temperature=0.0),
            submitted_at=time.time(),
        )
        for i in range(start, start + n)
    ]


def collected_ids(config: Config, batch_id: str, tmp_path: Path) -> list[str]:
    """The ``custom_id`` of every line ``collect`` writes for ``batch_id`` (both files)."""
    out, errors = tmp_path / f"{batch_id}.jsonl", tmp_path / f"{batch_id}.errors.jsonl"
    # every answer is on the topic already: collect only has to read them
    Client(config).collect(batch_id, out, errors, timeout_s=COLLECT_BOUND_S)
    lines = out.read_text().splitlines() + errors.read_text().splitlines()
    return [str(json.loads(line)["custom_id"]) for line in lines]


def merged(*ends: Mapping[int, int]) -> dict[int, int]:
    """End offsets of several publishes to one topic: the furthest of each partition."""
    out: dict[int, int] = {}
    for each in ends:
        for partition, end in each.items():
            out[partition] = max(out.get(partition, 0), end)
    return out


def conclude(
    name: str,
    config: Config,
    ends: Mapping[int, int],
    batches: Mapping[str, Sequence[str]],
    watcher: ResultWatcher,
    workers: Fleet,
    report: ChaosReport,
    tmp_path: Path,
    *,
    answer_bound_s: float,
    dead_letters: int = 0,
    raw_duplicates_because: str = "",
) -> ScenarioReport:
    """Wait for every answer, then assert the scenario's guarantees and report them.

    ``batches`` maps each batch id to the ``custom_id``s it holds; ``dead_letters``
    counts the records (keyed, each its own key) that can only be dead-lettered;
    ``raw_duplicates_because``: why repeats on the results topic are legitimate on the
    embedded broker in this scenario ("": they are not).
    """
    expected = {custom_id for ids in batches.values() for custom_id in ids}
    watcher.wait_until(
        lambda: watcher.ids >= expected and len(watcher.dead_keys) >= dead_letters,
        answer_bound_s,
        f"{len(expected)} requests answered and {dead_letters} dead-lettered",
        check=workers.assert_alive,
    )
    last_answer = time.monotonic()
    workers.assert_alive()
    wait_for_lag_zero(config, ends, LAG_BOUND_S)
    lag_zero_s = time.monotonic() - last_answer
    on_topic = Counter(
        decode_result(m.value(), m.headers()).custom_id
        for m in read_whole(config, config.kafka.results_topic, len(expected))
    )
    raw_duplicates = sum(on_topic.values()) - len(on_topic)
    repeated = sorted(i for i, n in on_topic.items() if n > 1)[:10]
    dead_duplicates = watcher.dead - len(watcher.dead_keys)
    if not raw_duplicates_because or os.environ.get("KAFKA_BOOTSTRAP"):
        assert raw_duplicates == 0, f"{raw_duplicates} repeats on the results topic: {repeated}"
        assert dead_duplicates == 0, f"{dead_duplicates} repeats on the dead-letter topic"
    lines = 0
    for batch_id, ids in batches.items():
        collected = collected_ids(config, batch_id, tmp_path)
        assert sorted(collected) == sorted(ids), f"{batch_id}: not one line per request"
        lines += len(collected)
    workers.assert_alive()
    row = ScenarioReport(
        scenario=name,
        requests=len(expected) + dead_letters,
        answered=len(expected) + len(watcher.dead_keys),
        collect_duplicates=lines - len(expected),
        raw_duplicates=raw_duplicates + dead_duplicates,
        restarts=workers.restarts,
        longest_stall_s=watcher.longest_stall_s,
        lag_zero_s=lag_zero_s,
    )
    report.add(row)
    return row
