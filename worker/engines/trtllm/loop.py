"""An asyncio event loop on a thread of its own, running from ``start`` until ``stop``.

TensorRT-LLM's results pick their reply queue when they are created: an asyncio queue
bound to the running loop (``GenerationResultBase.__init__`` in
``tensorrt_llm/executor/result.py``, via ``has_event_loop()``). Replies keep arriving
after a request is aborted or cancelled, so the loop must outlive every request: one loop
for the engine's whole life, never stopped between batches.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    """A running event loop; other threads hand it work with :meth:`spawn` and :meth:`call`."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def spawn(self, coroutine: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Run ``coroutine`` as a task on the loop."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def call(self, function: Callable[..., object], *args: object) -> None:
        """Call ``function(*args)`` on the loop's thread, soon."""
        self.loop.call_soon_threadsafe(function, *args)

    def call_and_wait(self, function: Callable[[], object], timeout_s: float) -> None:
        """Call ``function()`` on the loop's thread after what is already scheduled there,
        and wait for it; its exception is raised here."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()

        def run() -> None:
            try:
                function()
            except BaseException as exc:
                done.set_exception(exc)
            else:
                done.set_result(None)

        self.loop.call_soon_threadsafe(run)
        done.result(timeout=timeout_s)

    def stop(self, timeout_s: float) -> None:
        """Cancel what still runs, stop the loop and wait up to ``timeout_s`` for its thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self._cancel_and_stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()

    def _cancel_and_stop(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            task.cancel()
        # the cancelled tasks run their last step before the loop stops
        self.loop.call_soon(self.loop.stop)
