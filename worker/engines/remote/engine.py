"""``engine.kind: openai``: batch work sent to an OpenAI-compatible server the worker does
not host (vLLM, SGLang, TGI, an llm-d router), filling the capacity its interactive
traffic leaves.

An in-flight engine (:class:`~worker.engines.base.InFlightEngine`): every admitted request
becomes one HTTP call to the endpoint it addressed (:mod:`.bodies`), sent from an asyncio
loop on a thread of the engine's own. Everything above the engine is unchanged: the worker
still answers each request exactly once, commits offsets past answered requests only,
aborts the requests of a revoked partition or a cancelled batch (an aborted call's HTTP
request is closed), and applies fair share upstream.

* **In flight**: at most the AIMD window (:mod:`.aimd`) — :meth:`capacity` reports the
  window minus what is in flight, so the worker's in-flight stage never sends more. With
  ``metrics_url`` set, nothing new is sent while the server's own queue is above
  ``max_waiting`` (:mod:`.gate`). Flex-tier work gives way first: it starts only while
  the server has shown no pressure (a queue, an overload answer) for ``flex_quiet_ms``
  (:class:`.gate.FlexYield`, reported as :attr:`Capacity.flex`).
* **Errors**: 408, 429, 5xx, timeouts and lost connections are retried up to
  ``max_retries`` times with exponential back-off and full jitter (``Retry-After`` is
  honoured up to ``backoff_max_s``), then the request fails with 5000 naming the last
  status. Any other 4xx fails it with 4002 and the server's message; a 3xx with 5000
  (redirects are never followed, so an allowed server cannot bounce a request onto a
  private address). A 200 whose body is not the endpoint's object is 5000.
* **Tokens**: the server tokenizes; the worker's "token ids" are the input packed 4 bytes
  an id (:mod:`.packing`), so dedup and shared prefixes stay exact and the admission
  limits hold as an estimate. Usage in the answers is the server's own count, so
  ``Completion.prompt_tokens`` is the server's, not ``len(prompt_token_ids)``.
* **Safety**: the API key is read from the environment variable ``api_key_env`` names
  (never the config file); TLS is verified (``ca_bundle`` for a private CA); the server's
  address must be public unless ``allow_private`` (:mod:`worker.outbound`). ``load()``
  asks the server's ``/models`` once and refuses to start (5003) when it cannot be reached
  or does not serve ``engine.model``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import email.utils
import json
import math
import os
import random
import ssl
import threading
import time
from collections.abc import Collection, Sequence
from typing import Any, ClassVar

import httpx
from prometheus_client.registry import Collector

from batcher.errors import BatchpipeError
from worker.config import BatchingConfig, EngineConfig, RemoteConfig
from worker.engines.base import (
    MODEL_ENGINE_FIELDS,
    Capacity,
    Completion,
    EngineBroken,
    EngineInput,
    InFlightEngine,
)
from worker.engines.finished import Finished
from worker.engines.remote.aimd import ConcurrencyWindow
from worker.engines.remote.bodies import (
    AnswerError,
    Call,
    completion_of,
    embeddings_call,
    request_call,
)
from worker.engines.remote.failures import FailureLog
from worker.engines.remote.gate import RUNNING_SERIES, FlexYield, someone_else, waiting
from worker.engines.remote.packing import embedding_input, pack, request_input, unpack
from worker.engines.remote.stats import RemoteCollector, RemoteStats, outcome_of_status
from worker.errors import ErrorCode, ModelLoadError
from worker.outbound import OutboundRefused, check_url
from worker.wire.messages import Endpoint, InferenceRequest

#: statuses worth sending again: the server is busy or briefly broken, not the request
RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})
#: statuses (and timeouts) that mean the server is overloaded: the AIMD window halves
OVERLOADED = frozenset({429, 502, 503, 504})
#: the weight of each answer's time in the smoothed round trip (as TCP's SRTT: 1/8)
RTT_WEIGHT = 0.125
#: the share of engine.engine_timeout_s one request may take over all its attempts
BUDGET_SHARE = 0.9
LATE = "another attempt could outlast 0.9 × engine.engine_timeout_s = {:g} s"
JSON = {"Content-Type": "application/json"}
#: how much of a non-200 answer is read, for the server's message (an HTML 502 page, …)
ERROR_PAGE_BYTES = 64 * 1024
#: the most of the server's /metrics read (vLLM's is well under 1 MiB)
METRICS_BYTES = 8 * 1024 * 1024


class RemoteEngine(InFlightEngine):
    """Chat, completions and responses requests to ``engine.remote.base_url``."""

    endpoints: ClassVar[frozenset[Endpoint]] = frozenset({"chat", "completions", "responses"})
    honours = MODEL_ENGINE_FIELDS

    def __init__(self, engine: EngineConfig, batching: BatchingConfig) -> None:
        self.model_name = engine.model
        self._remote = r = engine.remote
        self._max_tokens = batching.max_batch_tokens
        self._budget_s = BUDGET_SHARE * engine.engine_timeout_s  # one request, all attempts
        self._window = ConcurrencyWindow(
            minimum=r.min_concurrency,
            maximum=r.max_concurrency,
            initial=r.initial_concurrency,
            adaptive=r.adaptive,
            latency_target_s=r.latency_target_ms / 1000.0,
        )
        self._cond = threading.Condition()
        self._inflight: dict[str, tuple[concurrent.futures.Future[None], int]] = {}
        self._held_tokens = 0
        self._done = Finished(self._cond)  # finished, not collected yet
        self._stats = RemoteStats()
        self._failures = FailureLog(r.base_url)
        self._gate_closed = False
        self._flex = FlexYield(r.flex_quiet_ms / 1000.0)
        self._others_wait = False  # the last reading found someone else's queue
        self._rtt_s = 1.0  # request time, smoothed; what one round trip of the window takes
        self._failure: BaseException | None = None
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._client: httpx.AsyncClient | None = None
        self._watcher: concurrent.futures.Future[None] | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, name="remote", daemon=True)

    # -- lifecycle -------------------------------------------------------------------------

    def load(self) -> None:
        r = self._remote
        try:
            check_url(r.base_url, allow_private=r.allow_private, setting="engine.remote.base_url")
            if r.metrics_url:
                check_url(
                    r.metrics_url,
                    allow_private=r.allow_private,
                    setting="engine.remote.metrics_url",
                )
        except OutboundRefused as exc:
            raise ModelLoadError(str(exc)) from exc
        key = os.environ.get(r.api_key_env)
        if key is None and r.api_key_env != RemoteConfig.api_key_env:
            raise ModelLoadError(
                f"engine.remote.api_key_env: the environment variable {r.api_key_env} is not "
                "set (set it to the server's API key, or to empty for none)"
            )
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._thread.start()
        try:
            self._client = self._call(self._make_client(headers))
        except (OSError, ssl.SSLError) as exc:
            raise ModelLoadError(
                f"engine.remote.ca_bundle: cannot use {r.ca_bundle!r}: {exc}"
            ) from exc
        served = self._call(self._served_models())
        if self.model_name not in served:
            raise ModelLoadError(
                f"engine.model {self.model_name!r} is not served by {r.base_url} "
                f"(its /models lists {', '.join(sorted(served)) or 'nothing'})"
            )
        if r.metrics_url:
            self._watcher = asyncio.run_coroutine_threadsafe(self._watch_queue(), self._loop)

    async def _make_client(self, headers: dict[str, str]) -> httpx.AsyncClient:
        r = self._remote
        return httpx.AsyncClient(
            base_url=r.base_url.rstrip("/"),
            headers=headers,
            timeout=r.timeout_s,
            verify=ssl.create_default_context(cafile=r.ca_bundle or None),
            follow_redirects=False,
            limits=httpx.Limits(max_connections=r.max_concurrency + 1),
        )

    async def _served_models(self) -> set[str]:
        """The ids ``/models`` lists, read within ``timeout_s`` and ``max_response_bytes``
        like any answer; anything else is a :class:`ModelLoadError` naming it."""
        assert self._client is not None
        r = self._remote
        where = f"cannot list the models of {r.base_url}"
        try:
            async with (
                asyncio.timeout(r.timeout_s),
                self._client.stream("GET", "/models") as response,
            ):
                body = await read_capped(response, r.max_response_bytes)
            status = response.status_code
            if status != 200:
                hint = ""
                if status in (401, 403):
                    given = "set" if os.environ.get(r.api_key_env) else "unset or empty"
                    hint = f" (the key comes from engine.remote.api_key_env: {r.api_key_env}, "
                    hint += f"{given})"
                raise ModelLoadError(f"{where}: HTTP {status}{hint}")
            return {str(m["id"]) for m in json.loads(body)["data"]}
        except TimeoutError as exc:
            raise ModelLoadError(f"{where}: no answer within {r.timeout_s} s") from exc
        except (TooLarge, httpx.HTTPError) as exc:
            raise ModelLoadError(f"{where}: {exc!r:.300}") from exc
        except (LookupError, TypeError, ValueError, AttributeError, RecursionError) as exc:
            raise ModelLoadError(f"{where}: not a list of models: {exc!r:.300}") from exc

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(
            self._remote.timeout_s + 5
        )

    def close(self) -> None:
        with self._cond:
            self._closed = True
            pending = [future for future, _ in self._inflight.values()]
            self._inflight.clear()
            self._cond.notify_all()
        for future in pending:
            future.cancel()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._thread.is_alive():
            if self._client is not None:
                self._call(self._client.aclose())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5.0)

    # -- what the worker calls -------------------------------------------------------------

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        return pack(request_input(request))

    def submit(self, item: EngineInput) -> None:
        call = self._call_of(item)
        tokens = len(item.prompt_token_ids) + item.sampling.max_tokens
        with self._cond:
            self._check()
            if item.key in self._inflight or item.key in self._done:
                raise ValueError(f"key {item.key!r} is already in flight")
            future = asyncio.run_coroutine_threadsafe(self._run(item.key, call), self._loop)
            self._inflight[item.key] = (future, tokens)
            self._held_tokens += tokens
            self._stats.in_flight = len(self._inflight)

    def _call_of(self, item: EngineInput) -> Call:
        return request_call(self.model_name, item)

    def abort(self, keys: Collection[str]) -> None:
        with self._cond:
            for key in keys:
                entry = self._inflight.pop(key, None)
                if entry is not None:
                    entry[0].cancel()  # cancels the task: its HTTP request is closed
                    self._held_tokens -= entry[1]
                self._done.discard(key)
            self._stats.in_flight = len(self._inflight)

    def completions(self, timeout_s: float = 0.0) -> list[Completion]:
        return self._done.take(timeout_s, lambda: self._failure is not None, self._check)

    def capacity(self) -> Capacity:
        with self._cond:
            limit = 0 if self._gate_closed else self._window.limit
            return Capacity(
                sequences=max(0, limit - len(self._inflight)),
                tokens=max(0, self._max_tokens - self._held_tokens),
                flex=self._flex_open(time.monotonic()),
            )

    def _flex_open(self, now: float) -> bool:
        """Flex work may start: nobody else's queue at the last reading, and quiet for
        ``flex_quiet_ms``."""
        return not self._others_wait and self._flex.open(now)

    def utilization(self) -> float:
        with self._cond:
            return min(1.0, len(self._inflight) / max(1, self._window.limit))

    def collectors(self) -> Sequence[Collector]:
        return (RemoteCollector(self._snapshot),)

    def _snapshot(self) -> RemoteStats:
        with self._cond:
            self._stats.limit = self._window.limit
            self._stats.cuts = self._window.cuts
            self._stats.flex_open = self._flex_open(time.monotonic())
            self._stats.flex_closings = self._flex.closings
            return self._stats

    def _check(self) -> None:
        if self._failure is not None:
            raise EngineBroken("the remote engine's loop failed") from self._failure
        if self._closed:
            raise EngineBroken("the remote engine is closed")

    # -- on the engine's loop --------------------------------------------------------------

    async def _run(self, key: str, call: Call) -> None:
        try:
            completion = await self._send(key, call)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a bug here must not lose the request: it is reported
            with self._cond:
                self._failure = exc
                self._cond.notify_all()
            raise
        with self._cond:
            entry = self._inflight.pop(key, None)
            if entry is None:  # aborted meanwhile: never completed
                return
            self._held_tokens -= entry[1]
            self._stats.in_flight = len(self._inflight)
            self._done.add(completion)

    async def _send(self, key: str, call: Call) -> Completion:
        """The request's one answer, after as many attempts as the errors allow."""
        r = self._remote
        try:  # a NaN or an infinity is no JSON: refused here, not raised out of the loop
            payload = json.dumps(call.body, separators=(",", ":"), allow_nan=False).encode()
        except ValueError as exc:
            message = f"the request cannot be sent as JSON: {exc}"
            return Completion.failed(key, ErrorCode.INVALID_PARAMETER, message, 0)
        attempt = 0
        started = time.monotonic()
        while True:
            sent = time.monotonic()
            retry_after = 0.0
            try:
                status, body, headers = await self._attempt(call.path, payload)
            except (TimeoutError, httpx.TimeoutException):
                outcome, overloaded, last = "timeout", True, f"no answer within {r.timeout_s} s"
            except httpx.TransportError as exc:  # refused, reset, closed mid-body
                outcome, overloaded, last = "connection", False, f"connection failed: {exc!r}"
            except (TooLarge, httpx.HTTPError) as exc:  # the answer itself is broken
                self._count("too_large" if isinstance(exc, TooLarge) else "unreadable")
                self._failures.failed("unreadable", _broken(exc), given_up=True)
                return Completion.failed(key, ErrorCode.ENGINE_FAILED, _broken(exc), 0)
            else:
                if status == 200:
                    self._failures.answered()
                    return self._answered(key, call, body, sent)
                outcome, overloaded = outcome_of_status(status), status in OVERLOADED
                last = f"HTTP {status}: {_server_message(body)}"
                if status not in RETRYABLE:
                    self._count(outcome)
                    self._failures.failed(outcome, last, given_up=True)
                    code = (
                        ErrorCode.INVALID_PARAMETER
                        if 400 <= status < 500
                        else ErrorCode.ENGINE_FAILED
                    )
                    return Completion.failed(key, code, f"the server answered {last}", 0)
                retry_after = retry_after_s(headers.get("retry-after"))
            ceiling = min(r.backoff_max_s, r.backoff_s * 2**attempt)
            pause = min(r.backoff_max_s, max(random.uniform(0, ceiling), retry_after))
            # the in-flight stage wedges the worker when nothing completes for
            # engine_timeout_s: a request stops retrying before it could get there
            late = time.monotonic() - started + pause + r.timeout_s > self._budget_s
            give_up = attempt >= r.max_retries or late
            with self._cond:
                self._stats.responses[outcome] += 1
                if overloaded:
                    now = time.monotonic()
                    self._window.on_overload(sent, now)
                    self._flex.pressure(now)
                if not give_up:
                    self._stats.retries += 1
            self._failures.failed(outcome, last, given_up=give_up)
            if give_up:
                why = "" if attempt >= r.max_retries else f" ({LATE.format(self._budget_s)})"
                message = f"the server failed {attempt + 1} attempts{why}; the last: {last}"
                return Completion.failed(key, ErrorCode.ENGINE_FAILED, message, 0)
            attempt += 1
            await asyncio.sleep(pause)

    async def _attempt(self, path: str, payload: bytes) -> tuple[int, bytes, httpx.Headers]:
        """One HTTP call within ``timeout_s`` in all (a server that drips its answer a byte
        at a time cannot hold it longer), its body read as it streams in and refused past
        ``max_response_bytes`` (never read whole first); of a non-200 answer only the start,
        for its message."""
        assert self._client is not None
        r = self._remote
        async with (
            asyncio.timeout(r.timeout_s),
            self._client.stream("POST", path, content=payload, headers=JSON) as response,
        ):
            if response.status_code == 200:
                body = await read_capped(response, r.max_response_bytes)
            else:
                body = await read_capped(response, ERROR_PAGE_BYTES, truncate=True)
            return response.status_code, body, response.headers

    def _answered(self, key: str, call: Call, body: bytes, sent: float) -> Completion:
        try:
            completion = completion_of(key, call, json.loads(body))
        except (AnswerError, ValueError, RecursionError) as exc:  # RecursionError: [[[[…
            self._count("unreadable")
            message = str(exc) if isinstance(exc, AnswerError) else f"not JSON: {exc!r:.300}"
            return Completion.failed(key, ErrorCode.ENGINE_FAILED, f"{call.path}: {message}", 0)
        with self._cond:
            self._stats.responses["ok"] += 1
            now = time.monotonic()
            if not self._window.on_success(sent, now):  # slower than latency_target_ms
                self._flex.pressure(now)
            self._rtt_s += RTT_WEIGHT * (now - sent - self._rtt_s)
        return completion

    def _count(self, outcome: str) -> None:
        with self._cond:
            self._stats.responses[outcome] += 1

    async def _watch_queue(self) -> None:
        assert self._client is not None
        r = self._remote
        while not self._closed:
            depth, running = await self._read_queue()
            with self._cond:
                self._stats.server_waiting = -1 if depth is None else depth
                self._gate_closed = depth is not None and depth > r.max_waiting
                self._others_wait = (
                    depth is not None
                    and depth > 0
                    and someone_else(depth, running, len(self._inflight))
                )
                if self._others_wait:  # flex gives way before the other tiers do
                    self._flex.pressure(time.monotonic())
                if self._gate_closed:  # someone's requests queue: batch work backs off too
                    # what the queue shows now follows from requests sent up to one round
                    # trip ago: so it cuts once a round trip, as a 429 would, not at every
                    # reading while the requests that caused it are still running
                    now = time.monotonic()
                    self._window.on_overload(now - self._rtt_s, now)
            await asyncio.sleep(r.metrics_interval_ms / 1000.0)

    async def _read_queue(self) -> tuple[int | None, int | None]:
        """The server's queue and its running requests from ``metrics_url``, read within
        one deadline and up to ``METRICS_BYTES``; None when it cannot be read (the
        running count: or when the server does not export it). The API key goes only where
        ``base_url`` is (scheme, host and port): a ``metrics_url`` elsewhere never gets it."""
        assert self._client is not None
        r = self._remote
        request = self._client.build_request("GET", r.metrics_url)
        if _origin(request.url) != _origin(self._client.base_url):
            request.headers.pop("Authorization", None)
        try:
            async with asyncio.timeout(min(r.timeout_s, 5.0)):
                response = await self._client.send(request, stream=True)
                try:
                    if response.status_code != 200:
                        return None, None
                    body = await read_capped(response, METRICS_BYTES)
                finally:
                    await response.aclose()
            text = body.decode("utf-8", "replace")
        except (TimeoutError, TooLarge, httpx.HTTPError):
            return None, None
        return waiting(text), waiting(text, RUNNING_SERIES)


class RemoteEmbedEngine(RemoteEngine):
    """``engine.task: embed``: ``/v1/embeddings`` requests to the server."""

    endpoints: ClassVar[frozenset[Endpoint]] = frozenset({"embeddings"})
    honours: ClassVar[frozenset[str]] = frozenset()

    def encode_inputs(self, request: InferenceRequest) -> tuple[tuple[int, ...], ...]:
        return tuple(pack(embedding_input(t, request.dimensions)) for t in request.embedding_inputs)

    def _call_of(self, item: EngineInput) -> Call:
        inputs = [unpack(ids) for ids in item.embedding_inputs]
        return embeddings_call(self.model_name, [text for _, text in inputs], inputs[0][0])


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host, url.port or default


class TooLarge(BatchpipeError):
    """The server's answer is longer than ``engine.remote.max_response_bytes``."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the server's answer exceeds engine.remote.max_response_bytes ({limit} bytes)"
        )


async def read_capped(response: httpx.Response, limit: int, *, truncate: bool = False) -> bytes:
    """The body of ``response``, read as it streams in: past ``limit`` bytes (decoded) it
    raises :class:`TooLarge`, or with ``truncate`` stops and keeps the first ``limit``."""
    declared = response.headers.get("content-length", "")
    if not truncate and declared.isdigit() and int(declared) > limit:
        raise TooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:
            if not truncate:
                raise TooLarge(limit)
            break
    return b"".join(chunks)[:limit]


def _broken(exc: Exception) -> str:
    if isinstance(exc, TooLarge):
        return str(exc)
    return f"the server's answer could not be read: {exc!r:.300}"


def _server_message(body: bytes) -> str:
    """The server's own words: OpenAI's ``error.message``, else the body's start."""
    try:
        answer = json.loads(body)
        error = answer.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        message = message or answer.get("message")
        if message:
            return str(message)[:500]
    except (ValueError, AttributeError, RecursionError):
        pass
    return body[:500].decode("utf-8", "replace").strip() or "(an empty body)"


def retry_after_s(value: str | None, now: float | None = None) -> float:
    """``Retry-After`` in seconds, a number or an HTTP date (RFC 9110); a past date, a
    negative number or nonsense reads as 0. The caller caps it at ``backoff_max_s``."""
    if not value:
        return 0.0
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return 0.0
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.UTC)
        seconds = when.timestamp() - (time.time() if now is None else now)
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0
