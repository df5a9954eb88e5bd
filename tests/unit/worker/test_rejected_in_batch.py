"""A request rejected at decode time is still counted in its batch.

``collect`` and ``status`` count a batch complete when ``batch_total`` distinct
``custom_id``s of that ``batch_id`` are answered; an error answer that lost the batch id
would leave the batch in progress forever.
"""

from __future__ import annotations

import json
from pathlib import Path

from batchpipe.collect import BatchTally, write_result
from worker.wire.messages import InferenceRequest, SamplingParams

from .fakes import GatedEngine
from .rig import P0, P1, loop_config, rig


def line(custom_id: str, **extra: object) -> str:
    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    fields = {"batch_id": "B", "batch_total": 3, "custom_id": custom_id}
    return json.dumps({**fields, "method": "POST", "url": "/v1/chat/completions", "body": body})


def test_requests_rejected_at_decode_keep_their_batch_and_the_batch_completes(
    tmp_path: Path,
) -> None:
    with rig(loop_config(), GatedEngine(gated=False)) as r:
        r.broker.append(0, line("hot", temperature=5).encode())  # 4002, from a JSON line
        r.broker.append(0, line("typed", max_tokens="many").encode())  # 4001, a wrong type
        r.broker.submit_request(  # 4002, from protobuf
            1,
            InferenceRequest(
                custom_id="wide",
                batch_id="B",
                batch_total=3,
                prompt="hi",
                sampling=SamplingParams(top_p=7.0),
            ),
        )
        r.consumer.rebalance("assign", [P0, P1])
        r.step_until(lambda: r.settled({"hot", "typed", "wide"}), "every record answered")

        tally = BatchTally("B")
        output, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
        with output.open("w") as out, errors.open("w") as err:
            for result in r.results():
                assert tally.add(result), f"{result.custom_id} is not counted in batch B"
                write_result(result, out, err)
        assert tally.complete and (tally.total, tally.failed) == (3, 3)
        lines = [json.loads(text) for text in errors.read_text().splitlines()]
        codes = {entry["custom_id"]: entry["error"]["code"] for entry in lines}
        assert codes == {"hot": "4002", "typed": "4001", "wide": "4002"}
