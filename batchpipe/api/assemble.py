"""A batch's output and error files, assembled from its answer log when it ends.

The lines are exactly those ``batchpipe collect`` writes (:func:`batchpipe.collect.
write_result`), one per ``custom_id``: completions to the output file, failures to the
error file, in the order of the batch's answer log (:mod:`batchpipe.api.answerlog`), so
that what partial reads gave is where they gave it. The answers the follower has not read
yet (a cancelled or expired batch's last ones) are read from the topic and appended to
the log first. A batch that ends cancelled or expired also has requests no worker answered;
each of them gets an error line with code 4005 ``batch_cancelled`` or 4006
``batch_expired``, built from the input file, so every ``custom_id`` of the batch appears
exactly once; they are appended to the log too. File ids are derived from the batch id,
so assembling twice (a restart, a second replica) writes files of the same ids and lines
(in each replica's order of its log). Both files expire the batch's
``output_expires_after`` after they are written (:mod:`batchpipe.api.retention`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from msgspec import structs

from batchpipe.api.answerlog import AnswerLog
from batchpipe.api.records import BatchRecord, Counts, FileRecord, Usage, output_file_id
from batchpipe.api.retention import expiry
from batchpipe.api.store import FileStore
from batchpipe.batchfile import FileLimits, iter_file
from batchpipe.collect import batch_results, batch_time, open_reader
from worker.config import Config
from worker.kafka.cancellations import Stop
from worker.loop.jobs import Identity, failed
from worker.wire.codec import CodecLimits

#: who answers the requests no worker answered, on the error lines
API_IDENTITY = "batchpipe-api"


@dataclass(frozen=True)
class Assembled:
    counts: Counts
    usage: Usage
    output: FileRecord | None
    errors: FileRecord | None


@contextmanager
def _staged(store: FileStore) -> Iterator[tuple[Path, Path]]:
    with ExitStack() as stack:
        yield stack.enter_context(store.staging()), stack.enter_context(store.staging())


def assemble(
    config: Config,
    batch: BatchRecord,
    input_file: Path,
    store: FileStore,
    limits: FileLimits,
    answers: AnswerLog,
    *,
    stop: Stop | None,
    created_at: int,
) -> Assembled:
    """Read the batch's results to the end of the topic into its answer log, and store
    the log's lines as its files.

    With ``stop``, every request without a result gets ``stop``'s error line.
    """
    kafka = config.kafka
    tally = answers.tally
    if not tally.complete:
        consumer, partitions = open_reader(kafka, kafka.results_topic, batch_time(batch.id))
        try:
            for result in batch_results(
                consumer,
                partitions,
                tally,
                CodecLimits.from_config(config.limits),
                until_end=True,
                deadline=None,
            ):
                answers.append(result)
        finally:
            consumer.close()
    if stop is not None and not tally.complete:
        identity = Identity(worker_id=API_IDENTITY, model=batch.model)
        for req in iter_file(input_file, limits):
            stamped = structs.replace(req, batch_id=batch.id, batch_total=batch.counts.total)
            answers.add(
                failed(req.custom_id, stop.code, stop.message, identity=identity, request=stamped)
            )
    with _staged(store) as (out_path, err_path):
        with out_path.open("wb") as out, err_path.open("wb") as err:
            answers.split(out, err)
        expires_at = expiry(created_at, batch.output_expires_after, config.api)
        files = [
            _store(store, path, batch, kind, created_at, expires_at)
            for path, kind in ((out_path, "output"), (err_path, "errors"))
        ]
    return Assembled(
        counts=Counts(batch.counts.total, tally.completed, tally.failed),
        usage=Usage(tally.prompt_tokens, tally.completion_tokens, tally.reasoning_tokens),
        output=files[0],
        errors=files[1],
    )


def _store(
    store: FileStore,
    path: Path,
    batch: BatchRecord,
    kind: str,
    created_at: int,
    expires_at: int | None,
) -> FileRecord | None:
    size = path.stat().st_size
    if size == 0:
        return None
    record = FileRecord(
        id=output_file_id(batch.id, kind),
        owner=batch.owner,
        filename=f"{batch.id}_{kind}.jsonl",
        size=size,
        created_at=created_at,
        purpose="batch_output",
        expires_at=expires_at,
    )
    store.put(record.id, path)
    return record
