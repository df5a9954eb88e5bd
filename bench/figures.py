"""What each benchmark result says, in words: the sentences :mod:`bench.tables` publishes.

:data:`BENCHES` describes every benchmark for bench/README.md, :data:`README_ROWS` the short
figures of README.md. Their sentences are made in :mod:`bench.describe`, by kind of benchmark,
each only of the figures one parsed ``bench/results/<name>.json`` records: nothing is typed
by hand.
"""

from __future__ import annotations

from bench.describe.benches import BENCHES
from bench.describe.engines import (
    default_engine_short,
    embeddings_short,
    engine_cpu_short,
    ideal_short,
    realtime_short,
    structured_short,
    vllm_direct_short,
)
from bench.describe.inflight import inflight_short
from bench.describe.pipeline import (
    api_short,
    batcher_echo_short,
    formation_short,
    latency_short,
    overhead_short,
    variant,
)
from bench.describe.scheduling import fairness_short, remote_short
from bench.describe.text import Describe, Result, n

__all__ = ["BENCHES", "README_ROWS", "Result", "n", "variant"]

#: (what is compared, result name, its figure) — README.md's table, in order
README_ROWS: tuple[tuple[str, str, Describe], ...] = (
    ("batching vs one request at a time, SmolLM2 on CPU", "realtime", realtime_short),
    ("batchpipe vs the same engine fed directly, no Kafka", "realtime", ideal_short),
    ("the default CPU engine, hf vs vllm through the worker", "realtime", default_engine_short),
    ("static batches vs batch 1, hf engine, SmolLM2 on CPU", "engine_cpu", engine_cpu_short),
    ("vLLM in flight vs static waves, SmolLM2 on CPU, no Kafka", "vllm_direct", vllm_direct_short),
    ("length-aware + shared-prefix formation vs FIFO, mixed prompts", "formation", formation_short),
    ("worker pipeline with the echo engine, default settings", "overhead", overhead_short),
    ("batch formation on a backlog, echo engine", "batcher_echo", batcher_echo_short),
    ("OpenAI API upload + create vs `batchpipe submit`, same file", "api", api_short),
    ("in flight vs static batches, through the worker", "inflight", inflight_short),
    ("structured outputs (xgrammar), SmolLM2 on CPU", "structured", structured_short),
    (
        "embeddings batched vs one at a time, all-MiniLM-L6-v2 on CPU",
        "embeddings",
        embeddings_short,
    ),
    ("latency at half and a tenth of capacity, echo engine", "latency", latency_short),
    ("fair share: small batches behind a large one", "fairness", fairness_short),
    ("remote engine (engine.kind openai) in front of a paced server", "remote", remote_short),
)
