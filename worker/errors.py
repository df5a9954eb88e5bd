"""Error codes of the wire contract (docs/architecture.md §5) and the exceptions that carry them."""

from __future__ import annotations

from enum import IntEnum

from batcher.errors import BatchpipeError

__all__ = ["BatchpipeError", "ErrorCode", "ModelLoadError", "RequestError"]


class ErrorCode(IntEnum):
    """Every request gets exactly one answer; a failed one carries one of these codes."""

    MALFORMED = 4001  # bad zstd/protobuf/JSON, schema violation, missing custom_id
    INVALID_PARAMETER = 4002  # a value out of range, unknown url or model
    OVER_LIMIT = 4003  # bytes, decompressed bytes, tokens
    DEADLINE_EXCEEDED = 4004  # the request's deadline passed before it ran
    BATCH_CANCELLED = 4005  # its batch was cancelled before the request ran
    BATCH_EXPIRED = 4006  # its batch's completion window passed before the request ran
    BATCH_QUARANTINED = 4007  # the feeder could not schedule its batch (the message says why)
    BATCH_CAP_REACHED = 4008  # its batch reached its token or cost cap before the request ran
    PUBLISH_INCOMPLETE = 4009  # its batch's publisher (fair: false) stopped before sealing it
    ENGINE_FAILED = 5000  # the engine failed on this request after split-and-retry
    MODEL_LOAD_FAILED = 5003  # the model failed to load, or is unknown


class RequestError(BatchpipeError):
    """A request that cannot be served; answered with ``code`` instead of a completion.

    ``custom_id`` is set when it could be recovered from the input, which decides
    whether the answer goes to the results topic or to the dead-letter topic. ``param``
    names the request field at fault when there is one (the OpenAI error's ``param``).
    ``batch_id`` and ``batch_total``, when recovered too, put the error answer in its batch
    (``collect`` and ``status`` count it there).
    """

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        custom_id: str | None = None,
        *,
        param: str | None = None,
        batch_id: str = "",
        batch_total: int = 0,
    ) -> None:
        super().__init__(message)
        self.code: ErrorCode = code
        self.message = message
        self.custom_id = custom_id
        self.param = param
        self.batch_id = batch_id
        self.batch_total = batch_total

    def in_batch(self, batch_id: str, batch_total: int) -> RequestError:
        """This error, placed in the batch its request named."""
        return RequestError(
            self.code,
            self.message,
            self.custom_id,
            param=self.param,
            batch_id=batch_id,
            batch_total=batch_total,
        )


class ModelLoadError(BatchpipeError):
    """The engine could not load its model (5003); the worker is not ready."""

    code = ErrorCode.MODEL_LOAD_FAILED
