"""The echo engine fed in flight: the echo's answers, paced like a step-scheduled model.

What vLLM or TensorRT-LLM do, reduced to their timing: one scheduler thread runs decoding
steps; every step produces one token for each sequence running in it and costs
``delay_per_token_s + delay_per_seq_token_s × running`` (a fixed cost, e.g. reading the
weights, and a cost per sequence). A sequence submitted during a step joins the next one,
and a sequence leaves the step in which its last token is produced: nobody waits for the
longest answer of a batch. Answers, stop strings and token counts are those of
:func:`worker.engines.echo.echo_completion`, so greedy output is identical alone, in a
static batch and in flight.

Steps run back to back on the device's clock: each ends ``cost`` after the previous one,
however late the step thread wakes (the worker loop may hold the GIL), as a GPU's steps
would. With both delays 0 a step costs nothing and every sequence finishes in the step
after it was submitted (no thread spins through empty steps).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection
from dataclasses import dataclass

from worker.engines.base import Capacity, Completion, EngineBroken, EngineInput, InFlightEngine
from worker.engines.echo import EchoEngine, echo_completion, encode_echo
from worker.engines.finished import Finished
from worker.engines.utilization import BusyMeter
from worker.wire.messages import InferenceRequest


@dataclass
class _Sequence:
    completion: Completion
    tokens: int  # prompt + max_tokens: what it holds of the engine's token room
    steps_left: int


class EchoInFlightEngine(InFlightEngine):
    """Echo answers from a step loop; room for ``max_sequences`` / ``max_tokens`` at once."""

    honours = EchoEngine.honours
    inert = EchoEngine.inert

    def __init__(
        self,
        *,
        delay_per_token_s: float = 0.0,
        delay_per_seq_token_s: float = 0.0,
        max_sequences: int = 32,
        max_tokens: int = 8192,
    ) -> None:
        self.model_name = "echo"
        self._fixed_s = delay_per_token_s
        self._per_seq_s = delay_per_seq_token_s
        self._max_sequences = max_sequences
        self._max_tokens = max_tokens
        self._cond = threading.Condition()
        self._running: dict[str, _Sequence] = {}
        self._held_tokens = 0
        self._done = Finished(self._cond)  # finished, not collected yet
        self._failure: BaseException | None = None
        self._closed = False
        self._meter = BusyMeter()
        self._thread = threading.Thread(target=self._loop, name="echo-steps", daemon=True)

    def load(self) -> None:
        self._thread.start()

    def encode(self, request: InferenceRequest) -> tuple[int, ...]:
        return encode_echo(request)

    def submit(self, item: EngineInput) -> None:
        completion = echo_completion(item)
        with self._cond:
            self._check()
            if item.key in self._running or item.key in self._done:
                raise ValueError(f"key {item.key!r} is already in flight")
            tokens = len(item.prompt_token_ids) + item.sampling.max_tokens
            # one step per token of a choice (n choices decode side by side); at least one
            # step, even for a sequence that generates nothing
            choices = 1 + len(completion.extra_choices)
            steps = max(1, completion.completion_tokens // choices)
            self._running[item.key] = _Sequence(completion, tokens, steps)
            self._held_tokens += tokens
            self._cond.notify_all()

    def abort(self, keys: Collection[str]) -> None:
        with self._cond:
            for key in keys:
                sequence = self._running.pop(key, None)
                if sequence is not None:
                    self._held_tokens -= sequence.tokens
                self._done.discard(key)  # finished but not collected: never reported now

    def completions(self, timeout_s: float = 0.0) -> list[Completion]:
        return self._done.take(timeout_s, lambda: self._failure is not None, self._check)

    def capacity(self) -> Capacity:
        with self._cond:
            return Capacity(
                sequences=max(0, self._max_sequences - len(self._running)),
                tokens=max(0, self._max_tokens - self._held_tokens),
            )

    def utilization(self) -> float:
        return self._meter.fraction()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._running.clear()
            self._held_tokens = 0
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(5.0)

    def _check(self) -> None:
        if self._failure is not None:
            raise EngineBroken("the echo engine's step loop failed") from self._failure
        if self._closed:
            raise EngineBroken("the echo engine is closed")

    def _loop(self) -> None:
        step_end: float | None = None  # when the previous step ended, on the device's clock
        try:
            while True:
                with self._cond:
                    if not self._running:
                        step_end = None  # idle: the next step starts when work arrives
                    self._cond.wait_for(lambda: self._running or self._closed)
                    if self._closed:
                        return
                    in_step = list(self._running)
                # steps follow each other on the device's own clock: a late wake-up of this
                # thread (the worker holding the GIL) delays no step, as it would not delay
                # a GPU's; only the step's own cost counts
                start = time.monotonic() if step_end is None else step_end
                step_end = start + self._fixed_s + self._per_seq_s * len(in_step)
                self._step(in_step, step_end)
        except BaseException as exc:  # reported to the worker by the next call
            with self._cond:
                self._failure = exc
                self._cond.notify_all()

    def _step(self, keys: list[str], end: float) -> None:
        """One decoding step of ``keys`` (the sequences running when it began), over at
        ``end`` (monotonic seconds)."""
        cost_s = self._fixed_s + self._per_seq_s * len(keys)
        with self._meter.busy():
            wait = end - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            with self._cond:
                for key in keys:
                    sequence = self._running.get(key)
                    if sequence is None:  # aborted during the step
                        continue
                    sequence.steps_left = 0 if cost_s == 0 else sequence.steps_left - 1
                    if sequence.steps_left == 0:
                        del self._running[key]
                        self._held_tokens -= sequence.tokens
                        self._done.add(sequence.completion)
