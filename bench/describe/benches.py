"""Every benchmark as bench/README.md's table describes it (:data:`BENCHES`)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.describe.engines import (
    embeddings_headline,
    engine_cpu_headline,
    gpu_headline,
    realtime_headline,
    structured_headline,
)
from bench.describe.inflight import inflight_headline, inflight_setup
from bench.describe.pipeline import (
    adaptive_headline,
    api_headline,
    batcher_echo_headline,
    formation_headline,
    latency_headline,
    overhead_headline,
    wire_headline,
)
from bench.describe.scheduling import fairness_headline, remote_headline
from bench.describe.text import Describe, n, x


@dataclass(frozen=True)
class Bench:
    """One row of bench/README.md's table: the question a script answers, and its answer."""

    script: str
    result: str  # bench/results/<result>.json
    command: str
    question: str
    setup: Describe  # the parameters the result records
    headline: Describe


BENCHES: tuple[Bench, ...] = (
    Bench(
        "batcher_echo.py",
        "batcher_echo",
        "python -m bench.batcher_echo",
        "the batches the worker forms from a backlog with the echo engine",
        lambda r: (
            f"{n(r['requests'])} requests, {r['engine']}, prefetch {r['prefetch_count']}, "
            f"max_batch_size {r['max_batch_size']}, max_batch_tokens {r['max_batch_tokens']}"
        ),
        batcher_echo_headline,
    ),
    Bench(
        "formation.py",
        "formation",
        "python -m bench.formation",
        "FIFO vs length-aware vs length-aware + shared-prefix batch formation",
        lambda r: (
            f"{r['model']}, prompts {'–'.join(map(str, r['workload']['prompt_tokens']))} "
            f"tokens, {r['workload']['shared_fraction'] * 100:.0f} % of them starting with one "
            f"{r['workload']['shared_system_prompt_tokens']}-token system prompt, max_tokens "
            f"{'–'.join(map(str, r['workload']['max_tokens']))}"
        ),
        formation_headline,
    ),
    Bench(
        "engine_cpu.py",
        "engine_cpu",
        "python -m bench.engine_cpu",
        "tokens/s of the hf engine at static batch sizes",
        lambda r: (
            f"{r['model']}, batch {'/'.join(str(x['batch_size']) for x in r['results'])}, "
            f"{r['new_tokens_per_request']} forced new tokens, best of {r['rounds']} rounds"
        ),
        engine_cpu_headline,
    ),
    Bench(
        "vllm_direct.py",
        "vllm_direct",
        "python -m bench.vllm_direct",
        "vLLM fed directly: static waves vs requests kept in flight",
        lambda r: (
            f"{r['model']}, vllm {r['vllm']}, {r['requests']} requests ({r['workload']}), "
            f"{r['wave_size']} at a time"
        ),
        lambda r: "; ".join(
            f"{run['dtype']}: waves {run['modes']['waves']['tokens_per_s']} tok/s, in flight "
            f"{run['modes']['in_flight']['tokens_per_s']} tok/s, {x(run['in_flight_vs_waves'])}"
            for run in r["runs"]
        ),
    ),
    Bench(
        "overhead.py",
        "overhead",
        "python -m bench.overhead",
        "requests/s of the worker with the echo engine vs a raw confluent-kafka passthrough "
        "on the same broker and messages; CPU µs per request by stage",
        lambda r: (
            f"{n(r['requests'])} requests of {r['request_value_bytes']:.0f} B; batching: "
            f"{r['batching']}"
        ),
        overhead_headline,
    ),
    Bench(
        "wire.py",
        "wire",
        "python -m bench.wire",
        "protobuf+zstd vs JSON (and JSON+zstd) for realistic request and result messages",
        lambda r: f"{n(r['messages'])} messages; {r['timing']}",
        wire_headline,
    ),
    Bench(
        "realtime.py",
        "realtime",
        "python -m bench.realtime",
        "the same requests (a) one at a time, (b) through the worker, (c) fed to the engine "
        "directly, for hf and vllm; the faster (b) is the default CPU engine",
        lambda r: (
            f"{r['model']}, {r['requests']} requests of {r['max_tokens']} tokens; "
            f"{r.get('note', '')}"
        ),
        realtime_headline,
    ),
    Bench(
        "adaptive.py",
        "adaptive",
        "python -m bench.adaptive",
        "fixed batch sizes vs the adaptive controller, steady and bursty arrivals",
        lambda r: (
            f"steady {r['arrival_rate_per_s']} req/s for {r['duration_s']:g} s, or "
            f"bursty: {r['bursty']}; engine: {r['engine']}"
        ),
        adaptive_headline,
    ),
    Bench(
        "api.py",
        "api",
        "python -m bench.api",
        "the OpenAI API path (upload, create, published) vs `batchpipe submit` on the same "
        "file, and the server's memory while it takes the upload",
        lambda r: f"{n(r['lines'])} lines, {r['file_bytes']} bytes; {r['note']}",
        api_headline,
    ),
    Bench(
        "inflight.py",
        "inflight",
        "python -m bench.inflight",
        "the same requests through the worker, static batches vs in flight (echo: padded "
        "batches, every row kept until the longest ends; vllm: the engine fed one batch at a "
        "time); the worker's RSS under a backlog in flight",
        inflight_setup,
        inflight_headline,
    ),
    Bench(
        "structured.py",
        "structured",
        "python -m bench.structured",
        "response_format json_schema through xgrammar: valid outputs and the throughput cost",
        lambda r: (
            f"{r['model']}, {r['requests']} requests over {r['schemas']} schemas, batches of "
            f"{r['batch_size']}, max_tokens {r['max_tokens']}, greedy"
        ),
        structured_headline,
    ),
    Bench(
        "embeddings.py",
        "embeddings",
        "python -m bench.embeddings",
        "/v1/embeddings requests one at a time vs batched (directly, and through the worker)",
        lambda r: (
            f"{r['model']}, {r['requests']} requests ({r['workload']}), batches of "
            f"{r['batch_size']}"
        ),
        embeddings_headline,
    ),
    Bench(
        "broker_earliest.py",
        "broker_earliest",
        "python -m bench.broker_earliest",
        "the embedded broker's earliest offset after concurrent transactional producers, "
        "and what a reader from OFFSET_BEGINNING vs offset 0 (FROM_START) gets",
        lambda r: (
            f"{r['broker']}, {r['trials']} one-partition topics, {r['producers']} producers "
            "committing one record each at once"
        ),
        lambda r: (
            f"earliest offset above 0 in {r['wrong_earliest']} of {r['trials']} topics; "
            f"records missed from OFFSET_BEGINNING: {r['lost_from_beginning']}, from offset 0: "
            f"{r['lost_from_start']} (of {n(r['records'])})"
        ),
    ),
    Bench(
        "gpu_check.sh",
        "gpu_check",
        "bench/gpu_check.sh",
        "one NVIDIA GPU, random-weight Llama: the hf engine with and without the pinned pool, "
        "the trtllm engine in flight and vLLM on dummy weights",
        lambda r: f"{r['model']}, {r['prompt_tokens']} prompt + {r['new_tokens']} new tokens",
        gpu_headline,
    ),
    Bench(
        "latency.py",
        "latency",
        "python -m bench.latency",
        "how long a request waits at half and a tenth of capacity (issue 29's goals)",
        lambda r: (
            f"echo static and in flight, {r['setup']['max_tokens']} tokens at "
            f"{r['setup']['step_s'] * 1000:.0f} ms a step, {r['setup']['seconds_per_load']:.0f} s "
            "a load, capacity measured first in the same run"
        ),
        latency_headline,
    ),
    Bench(
        "fairness.py",
        "fairness",
        "python -m bench.fairness",
        "small batches arriving while a large one runs, FIFO vs fair share (issues 23, 33, 39)",
        lambda r: (
            f"one worker, echo at 20 ms and at 1 s a step, {r['setup']['small_batches']} "
            f"batches of {r['setup']['small']} every {r['setup']['every_s']} s behind "
            f"{n(r['paces']['0.02']['large'])} and {n(r['paces']['1']['large'])}; three "
            f"workers at 1 s; {n(r['mixed_lengths']['requests'])} mixed-length requests on "
            f"the in-flight engine at 20 ms a step; {r['setup']['small_batches'] // 2} small "
            f"batches behind {n(r['cancel']['large'])} after a "
            f"{n(r['cancel']['doomed'])}-request cancel; the mover alone with "
            f"{n(r['mover']['64']['requests'])} requests"
        ),
        fairness_headline,
    ),
    Bench(
        "remote.py",
        "remote",
        "python -m bench.remote",
        "a server batchpipe does not host: throughput against a direct client, and "
        "interactive latency with batch work on top (issue 35)",
        lambda r: (
            f"stand-in server at {r['setup']['token_s'] * 1000:.0f} ms a step + "
            f"{r['setup']['per_seq_s'] * 1000:.1f} ms a sequence, {r['setup']['max_running']} "
            f"running at most; {r['setup']['interactive_clients']} interactive clients, "
            f"{r['setup']['burst_s']:.0f} s bursts and {r['setup']['idle_s']:.0f} s idle × "
            f"{r['setup']['cycles']}"
        ),
        remote_headline,
    ),
)
