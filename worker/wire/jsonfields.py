"""Typed access to one JSON object of a batch line: wrong types are 4001 naming the field,
unknown keys 4002 naming the key. Shared by the parsers of every endpoint's body."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from worker.errors import ErrorCode, RequestError


class Fields:
    """Typed access to one JSON object; wrong types are 4001 naming the field."""

    def __init__(self, obj: Mapping[str, Any], where: str, custom_id: str | None) -> None:
        self.obj, self.where, self.custom_id = obj, where, custom_id

    def error(self, code: ErrorCode, message: str, param: str | None = None) -> RequestError:
        return RequestError(code, message, self.custom_id, param=param)

    def unknown(self, known: frozenset[str], why: str) -> None:
        """4002 naming the first key of this object outside ``known``."""
        for key in self.obj:
            if key not in known:
                raise self.error(
                    ErrorCode.INVALID_PARAMETER, f"unknown field {self.where}{key}: {why}", key
                )

    def get(self, key: str, kind: type | tuple[type, ...], what: str) -> Any:
        """The value of ``key``, None when absent or null."""
        value = self.obj.get(key)
        if value is None:
            return None
        if isinstance(value, bool) is not (kind is bool) or not isinstance(value, kind):
            raise self.error(ErrorCode.MALFORMED, f"{self.where}{key} must be {what}")
        return value

    def integer(self, key: str) -> int | None:
        value: int | None = self.get(key, int, "an integer")
        return value

    def number(self, key: str) -> float | None:
        value = self.get(key, (int, float), "a number")
        try:
            return None if value is None else float(value)
        except OverflowError as exc:
            raise self.error(ErrorCode.INVALID_PARAMETER, f"{key} is out of range") from exc

    def string_map(self, key: str) -> dict[str, str]:
        value = self.get(key, dict, "an object of strings") or {}
        if not all(isinstance(v, str) for v in value.values()):
            raise self.error(ErrorCode.MALFORMED, f"{self.where}{key} values must be strings")
        return dict(value)
