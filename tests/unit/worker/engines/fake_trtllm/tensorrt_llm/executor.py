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
* Log probabilities (PyTorch backend): with ``logprobs=k``, ``CompletionOutput.logprobs``
  holds one ``{token id: Logprob(logprob, rank)}`` per token of ``token_ids`` (the end
  token's included). Here the chosen token has log(1/2) at rank 1 and the dict holds
  k - 1 other ids (the next ones), each half as likely as the one before.
"""

from __future__ import annotations

import asyncio
import math
import threading
from dataclasses import dataclass, field
from typing import Any

from .sampling_params import SamplingParams


class RequestError(RuntimeError):
    """The error raised when the request is failed."""


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class GenerationResult:
    def __init__(self, request_id: int, executor: FakeExecutor) -> None:
        self.request_id = request_id
        self._executor = executor
        self._loop = asyncio.get_running_loop()  # RuntimeError off the loop, as said above
        self._replies: asyncio.Queue[CompletionOutput | BaseException] = asyncio.Queue()
        self._done = False
        self.outputs = [CompletionOutput(0)]

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self._executor.abort_request(self.request_id)

    async def aresult(self) -> GenerationResult:
        while not self._done:
            reply = await self._replies.get()
            if isinstance(reply, BaseException):
                self._done = True
                raise reply
            self.outputs[0] = reply
            self._done = True
        return self

    def _deliver(self, reply: CompletionOutput | BaseException) -> bool:
        """From the executor's thread; False when the loop is gone and the reply is lost."""
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

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
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
        with self._cond:
            self._next_id += 1
            result = GenerationResult(self._next_id, self)
            self._pending.append(_Request(result, prompt, params))
            self._cond.notify_all()
        return result

    def abort_request(self, request_id: int) -> None:
        with self._cond:
            self.abort_calls.append(request_id)
            self._aborted.add(request_id)

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
                if request.result._deliver(reply):
                    self.answered.append(request.result.request_id)
                else:
                    self.lost_replies += 1

    def _answer(self, request: _Request, aborted: bool) -> CompletionOutput | BaseException:
        if aborted:
            return CompletionOutput(0, finish_reason="cancelled")
        if self.failing_tokens & set(request.prompt):
            return RequestError("Encountered an error in forwardAsync function")
        return generate(request.prompt, request.params, self._tokenizer)


def generate(prompt: list[int], params: SamplingParams, tokenizer: Any) -> CompletionOutput:
    """The stand-in model's answer, with stop strings and the end token as described above."""
    source = prompt[::-1]
    out = CompletionOutput(0, finish_reason="length")
    for step in range(params.max_tokens):
        ended = not params.ignore_eos and step >= len(source)
        out.token_ids.append(int(params.end_id or 0) if ended else source[step % len(source)])
        if ended:
            out.finish_reason = "stop"
            break
        matched = [
            (reason, ids)
            for reason, ids in params._get_stop_reasons_and_words()
            if ids and out.token_ids[-len(ids) :] == ids
        ]
        if matched:
            out.finish_reason, out.stop_reason = "stop", matched[0][0]
            if not params.include_stop_str_in_output:
                out.token_ids = out.token_ids[: -len(matched[0][1])]
            break
    if params.logprobs:
        vocab = len(tokenizer)
        out.logprobs = [_logprobs(token, params.logprobs, vocab) for token in out.token_ids]
    out.text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
    for stop in params._stops():
        at = out.text.find(stop)
        if at >= 0:
            cut = at + len(stop) if params.include_stop_str_in_output else at
            out.text, out.finish_reason, out.stop_reason = out.text[:cut], "stop", stop
            break
    return out


def _logprobs(token: int, k: int, vocab: int) -> dict[int, Logprob]:
    """The chosen ``token`` at log(1/2), and ``k - 1`` other ids, each half as likely."""
    entries = {token: Logprob(math.log(0.5), 1)}
    for rank in range(2, k + 1):
        entries[(token + rank) % vocab] = Logprob(math.log(0.5**rank), rank)
    return entries
