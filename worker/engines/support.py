"""Which engine honours which request field: the checks at admission and docs/fields.md.

The field table (:mod:`worker.wire.fields`) says how each body field is treated; an
engine class says which ``engine`` fields it applies (``Engine.honours``) and which cannot
change its answer (``Engine.inert``). From the two:

* :func:`refused_field` and :func:`unsupported` give the 4002 the worker answers at
  admission when a request asks for a field its engine does not honour;
* :func:`markdown` renders the tables of ``docs/fields.md`` (each field × each engine,
  for the generation endpoints — chat, completions, responses — and for
  ``/v1/embeddings``).
  ``python -m worker.engines.support`` rewrites it; a unit test fails when it is stale.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from worker.engines.base import Engine, ResolvedSampling
from worker.engines.factory import engine_class
from worker.errors import ErrorCode, RequestError
from worker.wire.fields import EMBED, FIELDS, GENERATE, BodyField
from worker.wire.messages import Endpoint

#: every engine kind in the table's columns, in order
ENGINE_KINDS = ("echo", "hf", "vllm", "trtllm", "openai")
#: the engine kinds that serve ``engine.task: embed``
EMBEDDING_KINDS = ("hf", "vllm", "openai")
DOC = Path(__file__).resolve().parents[2] / "docs" / "fields.md"
BEGIN, END = "<!-- fields:table -->", "<!-- /fields:table -->"


def support(field: BodyField, engine: type[Engine]) -> str:
    """``honoured``, ``refused``, ``accepted`` or ``no effect`` for ``field`` on ``engine``."""
    if field.treatment == "refused":
        return "refused"
    if field.treatment == "informational":
        return "accepted"
    if field.treatment == "honoured" or field.engine_name in engine.honours:
        return "honoured"
    return "no effect" if field.engine_name in engine.inert else "refused"


def refused_field(engine: Engine, sampling: ResolvedSampling) -> str | None:
    """The first field (by name) ``sampling`` asks for that ``engine`` cannot honour."""
    refused = sampling.asks_for - engine.honours - engine.inert
    return min(refused) if refused else None


def unsupported(engine: Engine, field: str, custom_id: str) -> RequestError:
    """The 4002 for a request asking ``engine`` for ``field``, which it does not honour."""
    return RequestError(
        ErrorCode.INVALID_PARAMETER,
        f"{field} is not supported by the {type(engine).__name__} engine of this worker",
        custom_id,
        param=field,
    )


def _engines(kinds: tuple[str, ...], task: str) -> Mapping[str, type[Engine] | None]:
    engines: dict[str, type[Engine] | None] = {}
    for kind in kinds:
        try:
            engines[kind] = engine_class(kind, task)
        except Exception:  # a kind this checkout does not have yet
            engines[kind] = None
    return engines


def _table(endpoints: frozenset[Endpoint], task: str, kinds: tuple[str, ...]) -> list[str]:
    """One row per field of ``endpoints``, one column per engine kind serving ``task``."""
    engines = _engines(kinds, task)
    rows = [
        "| field | endpoints | " + " | ".join(kinds) + " | notes |",
        "|---|---|" + "---|" * len(kinds) + "---|",
    ]
    for field in FIELDS:
        if not field.endpoints & endpoints:
            continue
        where = ", ".join(sorted(field.endpoints & endpoints))
        cells = ["n/a" if cls is None else support(field, cls) for cls in engines.values()]
        name = f"`{field.name}`" + (" (extension)" if field.extension else "")
        rows.append(f"| {name} | {where} | " + " | ".join(cells) + f" | {field.note} |")
    return rows


def markdown() -> str:
    """The tables of docs/fields.md: one row per field, one column per engine kind; the
    generation endpoints first, then ``/v1/embeddings`` (``engine.task: embed``)."""
    rows = [
        *_table(GENERATE, "generate", ENGINE_KINDS),
        "",
        "`/v1/embeddings`, served by a worker with `engine.task: embed`:",
        "",
        *_table(EMBED, "embed", EMBEDDING_KINDS),
    ]
    return "\n".join(rows) + "\n"


def rendered(document: str) -> str:
    """``document`` with the text between its table markers replaced by :func:`markdown`."""
    head, _, rest = document.partition(BEGIN + "\n")
    _, _, tail = rest.partition(END)
    return f"{head}{BEGIN}\n{markdown()}{END}{tail}"


def main() -> int:
    """Rewrite docs/fields.md's table in place (``--check``: exit 1 when it is stale)."""
    text = DOC.read_text()
    fresh = rendered(text)
    if "--check" in sys.argv[1:]:
        return int(fresh != text)
    DOC.write_text(fresh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
