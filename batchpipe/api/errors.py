"""Errors as the OpenAI API answers them: an HTTP status and ``{"error": {...}}``.

The body is OpenAI's error object — ``message``, ``type``, ``param``, ``code`` — as the
official SDK reads it (``openai.types.shared.ErrorObject``); the SDK raises its
``BadRequestError`` (400), ``AuthenticationError`` (401), ``NotFoundError`` (404),
``ConflictError`` (409) and ``APIStatusError`` (413, 415, 503) from it. A 503 carries
``Retry-After``: what failed is a dependency (Kafka), not the request.
"""

from __future__ import annotations

from typing import Any

from batcher.errors import BatchpipeError


class ApiError(BatchpipeError):
    """A request the API refuses; nothing was stored or published."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.error_code = code  # OpenAI's string code; BatchpipeError.code is the wire code
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str] | None:
        return None if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.error_code,
            }
        }


def not_found(kind: str, object_id: str, param: str | None = None) -> ApiError:
    """What OpenAI answers for an id that does not exist — or belongs to another key.
    The id is the caller's: it is shown cut to 100 characters."""
    shown = repr(object_id) if len(object_id) <= 100 else f"{object_id[:100]!r}..."
    return ApiError(404, f"No such {kind}: {shown}", param=param, code="not_found")


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


#: what a 503 asks a client to wait before it retries
RETRY_AFTER_S = 5


def unavailable(message: str) -> ApiError:
    """A dependency is down: answered at once, with ``Retry-After``, never a hang or a 500."""
    return ApiError(
        503,
        message,
        type="server_error",
        code="service_unavailable",
        retry_after_s=RETRY_AFTER_S,
    )
