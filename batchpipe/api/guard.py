"""What every request passes before a route sees it: body limits and, with ``--no-auth``,
the checks that keep web pages out.

Body limits: an upload (``POST /v1/files``) may carry ``api.max_file_bytes`` and its
multipart framing; every other body at most :data:`MAX_JSON_BYTES` (a valid batch
request is a few KB). A declared ``Content-Length`` over the limit is answered 413 before
anything is read; a body without one (chunked) is counted as it streams and refused 413
the moment it passes the limit, so no body is ever read or spooled past its limit.

``--no-auth`` (loopback only, no keys): any web page the operator visits could otherwise
call the API — a cross-origin form needs no CORS preflight, and a rebound DNS name
reaches 127.0.0.1. So the ``Host`` must be a loopback name or address (403
``host_not_allowed``), and a write (any method but GET/HEAD/OPTIONS) carrying an
``Origin`` other than the server's own is refused (403 ``cross_origin``). JSON bodies must
be ``application/json`` in every mode (:func:`require_json`), which a page cannot send
cross-origin without a preflight that this server never grants.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchpipe.api.auth import is_loopback
from batchpipe.api.errors import ApiError
from worker.config import ApiConfig

MAX_JSON_BYTES = 256 * 1024
#: multipart framing and the purpose field around an upload's own bytes
FRAMING_BYTES = 64 * 1024
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: routes whose body is an upload, limited by api.max_file_bytes
UPLOAD_ROUTES = frozenset({("POST", "/v1/files")})


def body_limit(api: ApiConfig) -> Callable[[str, str], int]:
    """The most bytes a request body may have, by method and path."""

    def limit(method: str, path: str) -> int:
        if (method, path) in UPLOAD_ROUTES:
            return api.max_file_bytes + FRAMING_BYTES
        return MAX_JSON_BYTES

    return limit


def too_large(limit: int, upload: bool) -> ApiError:
    return ApiError(
        413,
        f"the request body is over the limit of {limit} bytes for this endpoint",
        param="file" if upload else None,
        code="file_too_large" if upload else "request_too_large",
    )


def require_json(request: Request) -> None:
    """415 unless the body is declared ``application/json``."""
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json":
        raise ApiError(
            415,
            f"the body must be JSON sent as 'Content-Type: application/json', not {media!r}",
            code="unsupported_media_type",
        )


def _host_name(host: str) -> str:
    if host.startswith("["):  # [::1]:8000
        return host[1:].partition("]")[0]
    name, _, port = host.rpartition(":")
    return name if name and port.isdigit() else host


def _refusal(method: str, headers: Headers) -> ApiError | None:
    """Why an open (--no-auth) server refuses this request, or None."""
    host = headers.get("host", "")
    if not is_loopback(_host_name(host)):
        return ApiError(
            403,
            f"Host {host!r} is not a loopback name; without API keys this server answers "
            "only requests addressed to 127.0.0.1, ::1 or localhost",
            code="host_not_allowed",
        )
    origin = headers.get("origin")
    own = (f"http://{host}", f"https://{host}")
    if method not in _SAFE_METHODS and origin is not None and origin not in own:
        return ApiError(
            403,
            f"a write from origin {origin!r} is refused: without API keys this server "
            "takes writes only from its own origin or from clients that are not browsers",
            code="cross_origin",
        )
    return None


class Guard:
    """ASGI middleware: body limits always, the --no-auth checks when ``open``."""

    def __init__(self, app: ASGIApp, *, limit: Callable[[str, str], int], open: bool) -> None:
        self._app = app
        self._limit = limit
        self._open = open

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        method, path = scope["method"], scope["path"]
        refusal = _refusal(method, headers) if self._open else None
        limit = self._limit(method, path)
        upload = (method, path) in UPLOAD_ROUTES
        declared = headers.get("content-length", "")
        if refusal is None and declared.isdigit() and int(declared) > limit:
            refusal = too_large(limit, upload)
        if refusal is not None:
            response = JSONResponse(refusal.body(), status_code=refusal.status)
            await response(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:  # the route's own handler answers it: 413
                    raise too_large(limit, upload)
            return message

        await self._app(scope, counted, send)
