"""OpenAI's cursor pagination: ``limit`` items after the id ``after``, and ``has_more``.

The official SDK asks for the next page with ``after`` set to the last id of the page it
has, while ``has_more`` is true. An ``after`` that names nothing in the list is a 400:
the SDK never sends one, and answering an empty page would hide the mistake.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from batchpipe.api.errors import bad_request


class _HasId(Protocol):
    @property
    def id(self) -> str: ...


T = TypeVar("T", bound=_HasId)


def page(
    items: Sequence[T], after: str | None, limit: int, render: Callable[[T], dict[str, Any]]
) -> dict[str, Any]:
    """The page of ``items`` after ``after``, each as ``render`` shapes it."""
    start = 0
    if after is not None:
        ids = [item.id for item in items]
        if after not in ids:
            raise bad_request(f"after: no object with id {after!r} in this list", param="after")
        start = ids.index(after) + 1
    data = [render(item) for item in items[start : start + limit]]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + limit < len(items),
    }
