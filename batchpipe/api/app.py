"""The ASGI application (FastAPI) and ``batchpipe serve`` (uvicorn).

Routes: :mod:`.files`, :mod:`.batches`, and ``/healthz`` (the process and its state and
lifecycle threads live), ``/readyz`` (the state topic read to its end, Kafka answering,
the file store usable), ``/metrics`` (Prometheus). Every error — ours, the framework's
validation of query parameters, an unknown route — is answered as an OpenAI error
object; Kafka failing is a 503 with ``Retry-After``, never a 500 or a hang. The probes
run on the event loop and read flags only, so they answer while every worker thread
waits on Kafka. No schema or docs pages are served (``/openapi.json``, ``/docs``,
``/redoc``): docs/api.md is the reference, and an unauthenticated page would tell anyone
what the server runs.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType

import uvicorn
from confluent_kafka import KafkaException
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from batchpipe.api import batches, files, models, partial, retry
from batchpipe.api.auth import LOCAL_OWNER, Keys
from batchpipe.api.capmetrics import cap_exposition
from batchpipe.api.console import console_router
from batchpipe.api.context import Services, file_limits
from batchpipe.api.errors import ApiError, unavailable
from batchpipe.api.guard import Guard, body_limit
from batchpipe.api.keymetrics import key_exposition
from batchpipe.api.lifecycle import Lifecycle
from batchpipe.api.metrics import ApiMetrics
from batchpipe.api.state import KafkaUnavailable, StaleRecord, StateTopic
from batchpipe.api.store import FileStore, LocalStore
from batchpipe.api.webhooks.endpoints import load_endpoints
from batchpipe.api.webhooks.service import Webhooks
from batchpipe.fleet import FleetModels
from worker import __version__
from worker.config import ApiConfig, Config

log = logging.getLogger("batchpipe.api")

_START_TIMEOUT_S = 60.0
_STORE_CHECK_S = 2.0  # longest /readyz waits for the file store


def open_store(api: ApiConfig) -> FileStore:
    """The store ``api.store`` names."""
    if api.store == "s3":
        from batchpipe.api.s3store import S3Store

        return S3Store(api)
    return LocalStore(Path(api.store_dir).expanduser())


def _owners(keys: Keys) -> list[str]:
    return [LOCAL_OWNER] if keys.open else list(keys.by_key.values())


def _start(config: Config, keys: Keys) -> Services:
    state = StateTopic(config.kafka)
    state.start()
    store = open_store(config.api)
    metrics = ApiMetrics()
    webhooks = Webhooks(config, metrics.registry, _owners(keys))
    fleet = FleetModels(config.kafka)
    fleet.start()
    svc = Services(
        config=config,
        keys=keys,
        state=state,
        store=store,
        lifecycle=Lifecycle(config, state, store, file_limits(config.api)),
        metrics=metrics,
        webhooks=webhooks,
        fleet=fleet,
    )
    svc.lifecycle.start()
    webhooks.start()
    return svc


def _answer(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers())


def create_app(
    config: Config, keys: Keys, start: Callable[[Config, Keys], Services] = _start
) -> FastAPI:
    """The application; Kafka and the store are opened when it starts (lifespan) by
    ``start`` (the unit tests' start gives in-memory fakes)."""
    probe_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="api-ready")

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = start(config, keys)
        app.state.services = svc
        try:
            yield
        finally:
            if svc.webhooks is not None:
                svc.webhooks.close()
            svc.lifecycle.close()
            if svc.fleet is not None:
                svc.fleet.close()
            svc.state.close()
            probe_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(
        title="batchpipe",
        version=__version__,
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.include_router(files.router)
    app.include_router(batches.router)
    app.include_router(partial.router)
    app.include_router(retry.router)
    app.include_router(models.router)
    app.include_router(console_router(config.api, open_mode=keys.open))
    app.add_middleware(Guard, limit=body_limit(config.api), open=keys.open)

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return _answer(exc)

    @app.exception_handler(StaleRecord)
    async def stale(request: Request, exc: StaleRecord) -> JSONResponse:
        # another replica changed the batch between this one's read and write, twice
        message = f"the batch changed while this request ran; retry it ({exc})"
        return _answer(ApiError(409, message, code="conflict"))

    @app.exception_handler(KafkaUnavailable)
    async def kafka_unavailable(request: Request, exc: KafkaUnavailable) -> JSONResponse:
        return _answer(unavailable(str(exc)))

    @app.exception_handler(KafkaException)
    async def kafka_failed(request: Request, exc: KafkaException) -> JSONResponse:
        # librdkafka's own text goes to the log; the client learns what it can do
        log.warning("%s %s: Kafka failed: %r", request.method, request.url.path, exc)
        return _answer(unavailable("Kafka failed to answer; retry later"))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = str(first.get("loc", ["", ""])[-1]) or None
        error = ApiError(400, f"{param}: {first.get('msg', 'invalid')}", param=param)
        return JSONResponse(error.body(), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        error = ApiError(exc.status_code, str(exc.detail))
        return JSONResponse(error.body(), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def server_error(request: Request, exc: Exception) -> JSONResponse:
        # the file store failing mid-request, or a bug: logged here, answered as OpenAI
        # does, without the exception's text (it may name paths or hosts)
        log.error("%s %s failed: %r", request.method, request.url.path, exc)
        return _answer(ApiError(500, "the server failed; its log says why", type="server_error"))

    @app.middleware("http")
    async def count(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        response = await call_next(request)
        svc: Services | None = getattr(request.app.state, "services", None)
        if svc is not None:
            svc.metrics.request(request.method, response.status_code)
        return response

    # The probes are coroutines: they run on the event loop, never queue behind routes
    # that hold every worker thread, and read flags the state and lifecycle threads keep.
    @app.get("/healthz")
    async def healthz(request: Request) -> JSONResponse:
        svc: Services = request.app.state.services
        ok = svc.state.healthy and svc.lifecycle.healthy
        return JSONResponse({"ok": ok}, status_code=200 if ok else 503)

    @app.get("/readyz")
    async def readyz(request: Request) -> JSONResponse:
        svc: Services = request.app.state.services
        if not svc.state.healthy:
            return JSONResponse({"ready": False, "reason": "state topic"}, status_code=503)
        if not svc.state.reachable:
            return JSONResponse({"ready": False, "reason": "Kafka unreachable"}, status_code=503)
        check = asyncio.get_running_loop().run_in_executor(probe_pool, svc.store.check)
        try:
            await asyncio.wait_for(check, _STORE_CHECK_S)
        except TimeoutError:
            reason = f"file store: no answer in {_STORE_CHECK_S:g}s"
            return JSONResponse({"ready": False, "reason": reason}, status_code=503)
        except Exception as exc:  # any backend's failure makes the server not ready
            return JSONResponse({"ready": False, "reason": f"file store: {exc}"}, status_code=503)
        stalled = svc.lifecycle.feeders.stalled(time.time())
        if stalled is not None:  # ready still: a fleet scaled to zero needs its API up
            return JSONResponse({"ready": True, "warning": stalled})
        return JSONResponse({"ready": True})

    @app.get("/metrics")
    def metrics(request: Request) -> Response:
        svc: Services = request.app.state.services
        owners, batches = _owners(svc.keys), svc.state.batches()
        per_key = key_exposition(owners, batches, svc.lifecycle.progress)
        caps = cap_exposition(owners, batches, svc.lifecycle.progress)
        body = svc.metrics.exposition() + per_key + caps
        return Response(body, media_type="text/plain; version=0.0.4")

    return app


class Server:
    """The API served by uvicorn on a thread: ``batchpipe serve``, tests and benchmarks.

    ``port`` 0 picks a free one; :attr:`url` is the base URL once started.
    """

    def __init__(self, config: Config, keys: Keys, *, port: int | None = None) -> None:
        api = config.api
        self._server = uvicorn.Server(
            uvicorn.Config(
                create_app(config, keys),
                host=api.host,
                port=api.port if port is None else port,
                log_level="warning",
                access_log=False,
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="api-http", daemon=True)
        self.host = api.host

    @property
    def url(self) -> str:
        sockets = self._server.servers[0].sockets
        port = sockets[0].getsockname()[1]
        return f"http://{self.host}:{port}"

    def start(self) -> Server:
        self._thread.start()
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start (see its log)")
            time.sleep(0.05)
        return self

    def wait(self) -> None:
        self._thread.join()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(60)

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve(config: Config, keys: Keys) -> int:
    """Run ``batchpipe serve`` in the foreground until SIGINT/SIGTERM (uvicorn's handlers).
    The webhook endpoints are checked first, so that a bad entry stops the start naming
    it (a :class:`~worker.config.ConfigError`) before anything waits for Kafka."""
    load_endpoints(config.api, _owners(keys))
    log.info(
        "batchpipe API on http://%s:%d (auth %s)",
        config.api.host,
        config.api.port,
        "off" if keys.open else "on",
    )
    server = uvicorn.Server(
        uvicorn.Config(create_app(config, keys), host=config.api.host, port=config.api.port)
    )
    # uvicorn shuts down cleanly on SIGTERM, then raises the signal again against the
    # handler it found, which killed the process (exit 143); a clean shutdown exits 0, as
    # the worker does. SIGINT keeps its default (KeyboardInterrupt: exit 130).
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stopped) if main else None
    try:
        server.run()
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _stopped(signum: int, frame: FrameType | None) -> None:
    """SIGTERM after uvicorn's own shutdown: nothing left to do."""
