"""The thread that owns vLLM's engine: commands in, finished requests out.

vLLM's ``LLMEngine`` is not thread-safe, and on the CPU it binds the OpenMP threads of the
thread that creates it, so one thread creates it and makes every call on it for its whole
life. The worker talks to that thread through two queues: :meth:`EngineThread.add` and
:meth:`EngineThread.abort` post commands; finished requests come back on
:attr:`EngineThread.finished`. Between commands the thread calls ``step()`` while anything
is unfinished (vLLM's scheduler adds and retires sequences at every step) and blocks on
its inbox when nothing is.

The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): vLLM's default
spawns it as a child process, which re-imports the parent's ``__main__`` and so needs an
``if __name__ == "__main__"`` guard in every program that loads the engine.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.engines.utilization import BusyMeter
from worker.errors import BatchpipeError
from worker.wire.messages import FinishReason


@dataclass(frozen=True)
class Sample:
    """One choice of a finished request, as vLLM reported it."""

    text: str
    finish_reason: FinishReason
    token_ids: tuple[int, ...]
    #: one ``{token id: vllm.logprobs.Logprob}`` per generated token; None unless asked for
    logprobs: Sequence[Mapping[int, Any]] | None = None
    #: ended by the end-of-sequence token (vLLM's ``stop_reason`` None on a "stop"), which
    #: ``token_ids`` holds and the text does not
    ended_by_eos: bool = False


@dataclass(frozen=True)
class Finished:
    """One request's end, as the engine thread reports it: its choices in order, or
    ``error`` when vLLM refused or ended it."""

    run_id: str
    samples: tuple[Sample, ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class _Add:
    run_id: str
    prompt_token_ids: tuple[int, ...]
    params: Any  # vllm.SamplingParams


@dataclass(frozen=True)
class _Abort:
    run_ids: tuple[str, ...]


class _Stop:
    pass


class EngineBroken(BatchpipeError, RuntimeError):
    """vLLM failed outside any one request; the engine cannot go on."""


class EngineThread:
    """Runs ``make_engine()`` (an ``LLMEngine``) on a thread of its own; see the module doc."""

    def __init__(self, make_engine: Callable[[], Any], meter: BusyMeter) -> None:
        self._make_engine = make_engine
        self._meter = meter
        self._inbox: queue.SimpleQueue[_Add | _Abort | _Stop] = queue.SimpleQueue()
        #: finished requests, or what broke the engine (then nothing follows)
        self.finished: queue.SimpleQueue[Finished | EngineBroken] = queue.SimpleQueue()
        self._ready = threading.Event()
        #: set while vLLM holds no unfinished request and the inbox was empty
        self.idle = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="vllm-engine", daemon=True)

    def start(self) -> None:
        """Create the engine on the thread; raises what creating it raised."""
        # read by vllm.envs when the engine is created; see the module docstring
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self._thread.start()
        self._ready.wait()
        if self._failure is not None:
            self._thread.join()
            raise self._failure

    def add(self, run_id: str, prompt_token_ids: tuple[int, ...], params: Any) -> None:
        self._inbox.put(_Add(run_id, prompt_token_ids, params))

    def abort(self, run_ids: Sequence[str]) -> None:
        self._inbox.put(_Abort(tuple(run_ids)))

    def stop(self) -> None:
        """Abort everything, release the engine and end the thread."""
        if self._thread.is_alive():
            self._inbox.put(_Stop())
            self._thread.join()

    def _run(self) -> None:
        try:
            engine = self._make_engine()
        except BaseException as exc:
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            while self._apply(engine, self._commands(idle=not engine.has_unfinished_requests())):
                if engine.has_unfinished_requests():
                    with self._meter.busy():
                        outputs = engine.step()
                    for output in outputs:
                        if output.finished:
                            self.finished.put(_finished(output))
        except Exception as exc:
            self.finished.put(EngineBroken(f"vLLM failed: {exc!r}"))
        finally:
            _shut_down(engine)

    def _commands(self, *, idle: bool) -> list[_Add | _Abort | _Stop]:
        """What is in the inbox; when idle, waits for at least one command."""
        commands: list[_Add | _Abort | _Stop] = []
        if idle:
            self.idle.set()
            commands.append(self._inbox.get())
            self.idle.clear()
        while True:
            try:
                commands.append(self._inbox.get_nowait())
            except queue.Empty:
                return commands

    def _apply(self, engine: Any, commands: list[_Add | _Abort | _Stop]) -> bool:
        """Carry out ``commands``; False once told to stop."""
        for command in commands:
            if isinstance(command, _Stop):
                return False
            if isinstance(command, _Abort):
                engine.abort_request(list(command.run_ids))
                continue
            from vllm.inputs import TokensPrompt

            prompt = TokensPrompt(prompt_token_ids=list(command.prompt_token_ids))
            try:
                engine.add_request(command.run_id, prompt, command.params)
            except Exception as exc:  # vLLM refused this request only
                self.finished.put(Finished(command.run_id, error=str(exc)))
        return True


def _shut_down(engine: Any) -> None:
    """Release the engine and vLLM's process-wide state, so a later engine can load."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    try:
        engine.engine_core.shutdown()
    finally:
        cleanup_dist_env_and_memory()


def _finished(output: Any) -> Finished:
    samples = []
    for completion in output.outputs:  # all n of them: FINAL_ONLY waits for every one
        reason = completion.finish_reason
        if reason not in ("stop", "length"):  # "abort" or "error" by vLLM itself, not by us
            return Finished(output.request_id, error=f"vLLM ended it: {reason}")
        samples.append(
            Sample(
                text=completion.text,
                finish_reason="length" if reason == "length" else "stop",
                token_ids=tuple(completion.token_ids),
                logprobs=completion.logprobs,
                ended_by_eos=reason == "stop" and completion.stop_reason is None,
            )
        )
    return Finished(output.request_id, tuple(samples))
