"""A small OpenAI-compatible server, paced like a step-scheduled model, for tests and
``bench/remote.py``: what ``vllm serve`` looks like from outside, in one process, in
milliseconds, and able to misbehave on cue.

* **Pacing**: one scheduler runs decoding steps, as vLLM does. A step costs
  ``token_s + token_per_seq_s × running`` and gives every running sequence one token;
  at most ``max_running`` sequences run, the rest wait in arrival order (exported as
  ``vllm:num_requests_waiting`` on ``/metrics``). So a client that sends more than
  ``max_running`` at once only queues, and every extra sequence slows every step.
* **Answers**: the last message's (or the prompt's) words, one word a token, cut at
  ``max_tokens`` (finish ``length``), with OpenAI's usage counts; embeddings are a small
  deterministic vector per input. Bodies are what the official SDK's types read.
* **Cues**: :meth:`StandIn.fail` answers a status (429, 503, …) to the next requests or
  for a while; :attr:`StandIn.hang` accepts requests and never answers;
  :meth:`StandIn.stop` kills the server mid-batch (connections refused from then on).

``python -m bench.openai_standin --port 8001`` runs one on its own.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from worker.kafka.broker import free_port


@dataclass
class _Sequence:
    tokens: list[str]
    max_tokens: int
    done: asyncio.Future[None]
    produced: int = 0


@dataclass
class StandIn:
    """The server's behaviour; :meth:`start` serves it on ``127.0.0.1:port``."""

    model: str = "standin"
    token_s: float = 0.01
    token_per_seq_s: float = 0.0
    max_running: int = 64
    port: int = 0
    # serve HTTPS with this certificate and key (PEM files); "" serves plain HTTP
    certfile: str = ""
    keyfile: str = ""
    requests: int = 0  # requests received (every endpoint but /models and /metrics)
    completed: int = 0  # generation requests answered
    #: generation requests received, by the first word of their prompt (who sent them)
    arrivals: Counter[str] = field(default_factory=Counter)
    hang: bool = False
    authorization: str = ""  # the last request's Authorization header
    _fail_status: int = 0
    _fail_left: int = 0
    _fail_until: float = 0.0
    _waiting: deque[_Sequence] = field(default_factory=deque)
    _running: list[_Sequence] = field(default_factory=list)
    _wake: asyncio.Event | None = None
    _server: uvicorn.Server | None = None
    _thread: threading.Thread | None = None

    # -- cues, callable from any thread ----------------------------------------------------

    def fail(self, status: int, *, count: int = 0, seconds: float = 0.0) -> None:
        """Answer ``status`` to the next ``count`` requests, or to every request for
        ``seconds``; ``status`` 0 stops failing."""
        self._fail_status, self._fail_left = status, count
        self._fail_until = time.monotonic() + seconds if seconds else 0.0

    def _failing(self) -> int:
        if self._fail_left > 0:
            self._fail_left -= 1
            return self._fail_status
        return self._fail_status if time.monotonic() < self._fail_until else 0

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def base_url(self) -> str:
        scheme = "https" if self.certfile else "http"
        return f"{scheme}://127.0.0.1:{self.port}/v1"

    # -- serving ---------------------------------------------------------------------------

    def app(self) -> FastAPI:
        app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
        app.add_api_route("/v1/models", self._models, methods=["GET"])
        app.add_api_route("/metrics", self._metrics, methods=["GET"])
        for path in ("chat/completions", "completions", "responses", "embeddings"):
            app.add_api_route(f"/v1/{path}", self._endpoint(path), methods=["POST"])
        return app

    async def _models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.model, "object": "model"}]}

    async def _metrics(self) -> PlainTextResponse:
        lines = [
            f'vllm:num_requests_waiting{{model_name="{self.model}"}} {float(self.waiting)}',
            f'vllm:num_requests_running{{model_name="{self.model}"}} {float(self.running)}',
            f"standin_completed_total {float(self.completed)}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n")

    def _endpoint(self, path: str) -> Any:
        async def handle(request: Request) -> Response:
            self.requests += 1
            self.authorization = request.headers.get("authorization", "")
            status = self._failing()
            if status:
                headers = {"Retry-After": "0"} if status in (429, 503) else {}
                error = {"message": f"stand-in answers {status} on cue", "type": "server_error"}
                return JSONResponse({"error": error}, status_code=status, headers=headers)
            body = await request.json()
            if body.get("model") != self.model:
                error = {"message": f"model {body.get('model')!r} does not exist", "code": "404"}
                return JSONResponse({"error": error}, status_code=404)
            if self.hang:
                await asyncio.Event().wait()  # until the client gives up
            if path == "embeddings":
                return JSONResponse(_embeddings(body))
            return JSONResponse(await self._generate(path, body))

        return handle

    async def _generate(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        prompt = _prompt_text(path, body)
        words = prompt.split() or ["ok"]
        self.arrivals[words[0]] += 1
        limit = int(body.get("max_tokens") or body.get("max_output_tokens") or 16)
        sequence = _Sequence(words, limit, asyncio.get_running_loop().create_future())
        self._waiting.append(sequence)
        assert self._wake is not None
        self._wake.set()
        await sequence.done
        self.completed += 1
        text = " ".join(words[: sequence.produced])
        finish = "length" if sequence.produced < len(words) else "stop"
        usage = {"prompt_tokens": len(prompt) // 4 + 1, "completion_tokens": sequence.produced}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        answer = _answer(path, self.model, text, finish, usage)
        if "choices" in answer:  # n choices, all the same text (usage counts one)
            only = answer["choices"][0]
            answer["choices"] = [{**only, "index": i} for i in range(int(body.get("n") or 1))]
        return answer

    async def _steps(self) -> None:
        """The scheduler: steps back to back while anything runs or waits."""
        assert self._wake is not None
        while True:
            while len(self._running) < self.max_running and self._waiting:
                self._running.append(self._waiting.popleft())
            if not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            await asyncio.sleep(self.token_s + self.token_per_seq_s * len(self._running))
            still = []
            for sequence in self._running:
                sequence.produced += 1
                if sequence.produced >= min(sequence.max_tokens, len(sequence.tokens)):
                    if not sequence.done.done():
                        sequence.done.set_result(None)
                else:
                    still.append(sequence)
            self._running = still

    def start(self) -> StandIn:
        """Serve on a thread of its own; returns once it accepts connections."""
        self.port = self.port or free_port()
        config = uvicorn.Config(
            self.app(),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            ssl_certfile=self.certfile or None,
            ssl_keyfile=self.keyfile or None,
        )
        self._server = uvicorn.Server(config)
        ready = threading.Event()

        async def serve() -> None:
            self._wake = asyncio.Event()
            scheduler = asyncio.create_task(self._steps())
            ready.set()
            assert self._server is not None
            await self._server.serve()
            scheduler.cancel()

        self._thread = threading.Thread(target=lambda: asyncio.run(serve()), daemon=True)
        self._thread.start()
        ready.wait(10)
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the stand-in server did not start within 10 s")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving at once: open connections are closed, new ones refused."""
        if self._server is not None:
            self._server.should_exit = True
            self._server.force_exit = True
        if self._thread is not None:
            self._thread.join(10)


def _prompt_text(path: str, body: dict[str, Any]) -> str:
    if path == "chat/completions":
        return str(body["messages"][-1]["content"])
    if path == "responses":
        items = body["input"]
        return str(items[-1]["content"]) if isinstance(items, list) else str(items)
    prompt = body["prompt"]
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


def _answer(path: str, model: str, text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
    now = int(time.time())
    if path == "chat/completions":
        message = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return {
            "id": "chatcmpl-standin",
            "object": "chat.completion",
            "created": now,
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
    if path == "completions":
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
        return {
            "id": "cmpl-standin",
            "object": "text_completion",
            "created": now,
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
    content = [{"type": "output_text", "text": text, "annotations": []}]
    output = [
        {
            "type": "message",
            "id": "msg-standin",
            "role": "assistant",
            "status": "completed",
            "content": content,
        }
    ]
    return {
        "id": "resp-standin",
        "object": "response",
        "created_at": now,
        "model": model,
        "status": "incomplete" if finish == "length" else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if finish == "length" else None,
        "output": output,
        "usage": {
            "input_tokens": usage["prompt_tokens"],
            "output_tokens": usage["completion_tokens"],
            "total_tokens": usage["total_tokens"],
        },
    }


def _embeddings(body: dict[str, Any]) -> dict[str, Any]:
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    size = int(body.get("dimensions") or 8)
    data = []
    for index, text in enumerate(texts):
        digest = hashlib.sha256(str(text).encode()).digest()
        data.append(
            {"object": "embedding", "index": index, "embedding": [b / 255.0 for b in digest[:size]]}
        )
    tokens = sum(len(str(t)) // 4 + 1 for t in texts)
    return {
        "object": "list",
        "data": data,
        "model": body["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--model", default="standin")
    parser.add_argument("--token-s", type=float, default=0.01)
    parser.add_argument("--per-seq-s", type=float, default=0.0)
    parser.add_argument("--max-running", type=int, default=64)
    args = parser.parse_args()
    server = StandIn(
        args.model, args.token_s, args.per_seq_s, max_running=args.max_running, port=args.port
    )
    server.start()
    print(server.base_url, flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
