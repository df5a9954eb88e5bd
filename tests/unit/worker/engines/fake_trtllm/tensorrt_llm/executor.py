"""Results and the executor, as in ``tensorrt_llm/executor/result.py`` and ``utils.py``.

* ``RequestError(RuntimeError)``: a per-request failure, raised by ``aresult()`` when the
  executor answers a request with an error (``GenerationExecutor._handle_background_error``).
* ``GenerationResult``: made by ``generate_async``; binds its reply queue to the running
  event loop (the real one falls back to a thread queue without a loop, and then
  ``aresult()`` fails: "The asyncio event loop was not present during initialization");
  ``aresult()``, ``abort()``, ``finished``, ``outputs`` (``CompletionOutput``).
* Stop strings, as ``GenerationResultBase._handle_sequence`` and
  ``DetokenizedGenerationResultBase._handle_response`` treat them: matched as tokens, the
  stop tokens are trimmed from ``token_ids`` unless ``include_stop_str_in_output``; the
  decoded text is then cut at a stop string found in it (before it, or after it when
  ``include_stop_str_in_output``). The end token stays in ``token_ids``. An aborted request
  is answered with finish reason "cancelled".
* Log probabilities (PyTorch backend, ``TorchSampler`` in
  ``tensorrt_llm/_torch/pyexecutor/sampler.py``): with ``logprobs=k``,
  ``CompletionOutput.logprobs`` holds one ``{token id: Logprob(logprob, rank)}`` per token
  of ``token_ids`` (the end token's included): the top k of the raw log-softmax, so a
  sampled token that is not the most likely one is missing from it when k is small. Here
  the most likely token has log(1/2) at rank 1 and the dict holds k - 1 other ids (the
  next ones), each half as likely as the one before.
* Sampling (``TorchSampler`` of 1.2.x, ``sampler.py``): no penalty is applied
  (repetition, presence and frequency penalties are silently ignored; PR #16485 added
  them after 1.2.1) and one generator seeded 42 draws for every request, whatever its
  ``seed`` (per-request seeds came with PR #17172). Here a sampled step (not greedy) takes
  the most likely token or the next id, by that shared generator.
* Results without a running loop (``GenerationResultBase.__init__``, ``has_event_loop()``):
  the reply queue falls back silently to a thread queue, and ``aresult()`` then fails its
  assertion "The asyncio event loop was not present during initialization".
* An error reply (``_handle_response``): ``RequestError`` is raised while the response is
  handled, before ``_done`` is set, so ``finished`` stays False.
* Shutdown (``tensorrt_llm/executor/proxy.py``, ``pre_shutdown``/``_abort_all_requests``):
  every result not finished is aborted from the thread that calls ``shutdown()``, through
  the same request queue (a ZMQ socket) that ``generate_async`` and ``abort()`` write to.
  A ZMQ socket must never be used from two threads; this stand-in refuses a write from a
  second thread while the first still lives, where the real one would race.
* Guided decoding (``tensorrt_llm/_torch/pyexecutor/grammar_matcher.py``): a ``json``
  guide is compiled by xgrammar in strict mode, whatever the request's ``strict`` said; a
  guide that does not compile fails its request. The stand-in's "model" cannot write
  JSON, so its answers are not constrained: only the compilation is modelled.
* End of generation: only ``end_id`` (the tokenizer's EOS) and ``stop_token_ids`` end a
  request. ``generation_config.json``'s other EOS ids (a chat model's end of turn) do not:
  here the model ends its turn with the first of them and, unless stopped, goes on.
"""

from __future__ import annotations

import asyncio
import json
import queue
import random
import threading
from dataclasses import dataclass
from typing import Any

from ._model import CompletionOutput, Logprob, end_of_turn, generate
from .sampling_params import SamplingParams

__all__ = ["CompletionOutput", "GenerationResult", "Logprob", "RequestError"]


class RequestError(RuntimeError):
    """The error raised when the request is failed."""


NO_LOOP = (
    "The asyncio event loop was not present during initialization, so async operations "
    "are not available."
)


class GenerationResult:
    def __init__(self, request_id: int, executor: FakeExecutor) -> None:
        self.request_id = request_id
        self._executor = executor
        self._loop: asyncio.AbstractEventLoop | None
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # no running loop: a thread queue, silently (result.py)
            self._loop = None
        self._replies: asyncio.Queue[CompletionOutput | BaseException] = asyncio.Queue()
        self._thread_replies: queue.Queue[CompletionOutput | BaseException] = queue.Queue()
        self._done = False
        self.outputs = [CompletionOutput(0)]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self._executor.abort_request(self.request_id)

    async def aresult(self) -> GenerationResult:
        assert self._loop is not None, NO_LOOP
        while not self._done:
            reply = await self._replies.get()
            if isinstance(reply, BaseException):
                raise reply  # while handling the response: _done stays False
            self.outputs[0] = reply
            self._done = True
        return self

    def _deliver(self, reply: CompletionOutput | BaseException) -> bool:
        """From the executor's thread; False when the loop is gone and the reply is lost."""
        if self._loop is None:
            self._thread_replies.put(reply)
            return True
        try:
            self._loop.call_soon_threadsafe(self._replies.put_nowait, reply)
        except RuntimeError:  # "Event loop is closed"
            return False
        return True


@dataclass
class _Request:
    result: GenerationResult
    prompt: list[int]
    params: SamplingParams


class FakeExecutor:
    """Answers requests on its own thread, in submission order, unless held."""

    def __init__(self, tokenizer: Any, model: str = "") -> None:
        self._tokenizer = tokenizer
        self._end_of_turn = end_of_turn(model, tokenizer)
        self._generator = random.Random(42)  # TorchSampler's one generator, for every request
        self._writer: threading.Thread | None = None  # the thread that writes to the queue
        self._open: dict[int, GenerationResult] = {}  # not finished: shutdown aborts them
        self.compiled: list[tuple[str, bool]] = []  # (json guide, strict) per compiled guide
        self._cond = threading.Condition()
        self._pending: list[_Request] = []
        self._aborted: set[int] = set()
        self._held = False
        self._stopping = False
        self._crash: BaseException | None = None
        self._next_id = 0
        self.failing_tokens: set[int] = set()  # a prompt holding one gets an error reply
        self.abort_calls: list[int] = []
        self.answered: list[int] = []  # request ids whose reply reached their loop
        self.lost_replies = 0
        self._thread = threading.Thread(target=self._run, name="fake-trtllm", daemon=True)
        self._thread.start()

    def submit(self, prompt: list[int], params: SamplingParams) -> GenerationResult:
        self._write("generate_async")
        with self._cond:
            self._next_id += 1
            result = GenerationResult(self._next_id, self)
            self._pending.append(_Request(result, prompt, params))
            self._open[result.request_id] = result
            self._cond.notify_all()
        return result

    def abort_request(self, request_id: int) -> None:
        self._write("abort_request")
        with self._cond:
            self.abort_calls.append(request_id)
            self._aborted.add(request_id)

    def _write(self, what: str) -> None:
        """The request queue is one ZMQ socket (proxy.py): one thread may write to it."""
        me = threading.current_thread()
        if self._writer is None or not self._writer.is_alive():
            self._writer = me
        elif self._writer is not me:
            raise RuntimeError(
                f"{what} from thread {me.name} while {self._writer.name} writes to the "
                "request queue: a ZMQ socket shared by two threads"
            )

    def hold(self) -> None:
        with self._cond:
            self._held = True

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()

    def crash(self, error: BaseException) -> None:
        """Answer every request from now on with ``error``, as a broken executor would."""
        with self._cond:
            self._crash = error
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def is_shutdown(self) -> bool:
        return self._stopping

    def shutdown(self) -> None:
        """``pre_shutdown``: abort every result not finished, from this thread; then stop."""
        with self._cond:
            open_results = list(self._open.values())
        for result in open_results:
            result.abort()
        self._write("shutdown")  # the quit message goes through the same queue
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or (self._pending and not self._held))
                if self._stopping:
                    return
                batch, self._pending = self._pending, []
                aborted, crash = set(self._aborted), self._crash
            for request in batch:
                reply = crash or self._answer(request, request.result.request_id in aborted)
                with self._cond:
                    self._open.pop(request.result.request_id, None)
                if request.result._deliver(reply):
                    self.answered.append(request.result.request_id)
                else:
                    self.lost_replies += 1

    def _answer(self, request: _Request, aborted: bool) -> CompletionOutput | BaseException:
        if aborted:
            return CompletionOutput(0, finish_reason="cancelled")
        if self.failing_tokens & set(request.prompt):
            return RequestError("Encountered an error in forwardAsync function")
        guide = request.params.guided_decoding
        if guide is not None and guide.json is not None:
            problem = self._compile(guide.json)
            if problem is not None:
                return RequestError(f"Failed to compile the guide: {problem}")
        return generate(
            request.prompt, request.params, self._tokenizer, self._end_of_turn, self._generator
        )

    def _compile(self, schema: str | dict[str, Any]) -> str | None:
        """grammar_matcher.py: ``compile_json_schema`` in xgrammar's strict mode, always."""
        import xgrammar as xgr

        text = schema if isinstance(schema, str) else json.dumps(schema)
        self.compiled.append((text, True))
        try:
            xgr.Grammar.from_json_schema(text, strict_mode=True)
        except Exception as exc:
            return str(exc)
        return None
