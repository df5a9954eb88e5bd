"""Which engine honours which request field: the checks at admission and docs/fields.md.

The field table (:mod:`worker.wire.fields`) says how each body field is treated; an
engine class says which ``engine`` fields it applies (``Engine.honours``) and which cannot
change its answer (``Engine.inert``). From the two:

* :func:`refusal` is the 4002 the worker answers at admission when a request asks for a
  field its engine does not honour;
* :func:`markdown` renders the table of ``docs/fields.md`` (each field × each engine).
  ``python -m worker.engines.support`` rewrites it; a unit test fails when it is stale.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from worker.engines.base import Engine, ResolvedSampling
from worker.engines.factory import engine_class
from worker.errors import ErrorCode, RequestError
from worker.wire.fields import FIELDS, BodyField

#: every engine kind in the table's columns, in order
ENGINE_KINDS = ("echo", "hf", "vllm", "trtllm")
DOC = Path(__file__).resolve().parents[2] / "docs" / "fields.md"
BEGIN, END = "<!-- fields:table -->", "<!-- /fields:table -->"


def support(field: BodyField, engine: type[Engine]) -> str:
    """``honoured``, ``refused``, ``accepted`` or ``no effect`` for ``field`` on ``engine``."""
    if field.treatment == "refused":
        return "refused"
    if field.treatment == "informational":
        return "accepted"
    if field.treatment == "honoured" or field.name in engine.honours:
        return "honoured"
    return "no effect" if field.name in engine.inert else "refused"


def refusal(engine: Engine, sampling: ResolvedSampling, custom_id: str) -> RequestError | None:
    """The 4002 for the first field ``sampling`` asks for that ``engine`` cannot honour."""
    refused = sorted(sampling.asks_for - engine.honours - engine.inert)
    if not refused:
        return None
    return RequestError(
        ErrorCode.INVALID_PARAMETER,
        f"{refused[0]} is not supported by the {type(engine).__name__} engine of this worker",
        custom_id,
        param=refused[0],
    )


def _engines() -> Mapping[str, type[Engine] | None]:
    engines: dict[str, type[Engine] | None] = {}
    for kind in ENGINE_KINDS:
        try:
            engines[kind] = engine_class(kind)
        except Exception:  # a kind this checkout does not have yet
            engines[kind] = None
    return engines


def markdown() -> str:
    """The table of docs/fields.md: one row per field, one column per engine kind."""
    engines = _engines()
    endpoints = {"chat": "chat", "completions": "completions"}
    rows = [
        "| field | endpoints | " + " | ".join(ENGINE_KINDS) + " | notes |",
        "|---|---|" + "---|" * len(ENGINE_KINDS) + "---|",
    ]
    for field in FIELDS:
        where = ", ".join(endpoints[e] for e in sorted(field.endpoints))
        cells = ["n/a" if cls is None else support(field, cls) for cls in engines.values()]
        name = f"`{field.name}`" + (" (extension)" if field.extension else "")
        rows.append(f"| {name} | {where} | " + " | ".join(cells) + f" | {field.note} |")
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
