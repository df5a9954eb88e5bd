"""The console for batch owners: ``/`` (batches, new batch) and ``/batches/{id}`` (one batch).

The server renders only a shell — the page's structure, whether keys are needed and the
price per 1k tokens — never a file or a batch: ``static/console.js`` fetches those from
the JSON API (``/v1/files``, ``/v1/batches``) with the key the person signed in with, so
the console sees exactly what that key's SDK would, and nothing a page could leak without
it. The key lives in the tab's ``sessionStorage`` and travels only in the
``Authorization`` header, never in a URL. With ``--no-auth`` (loopback only) there is no
sign-in and the API's own Host and Origin checks apply to the console's calls as to any.

Every answer carries a strict Content-Security-Policy: scripts and styles from this
server's files only (no inline script or style, no ``eval``), calls to this origin only,
no framing, no form posts (the forms are handled by the script).
"""

from __future__ import annotations

import html
from importlib import resources
from string import Template

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from batchpipe.api.errors import not_found
from worker.config import ApiConfig

#: the console's static files and their media types
ASSETS = {"console.js": "text/javascript", "console.css": "text/css"}

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
}


def _static(name: str) -> str:
    return (resources.files("batchpipe.api") / "static" / name).read_text(encoding="utf-8")


#: the expiry choices of the new-batch form (within retention's bounds)
EXPIRY_CHOICES = (
    (3600, "1 hour"),
    (86400, "1 day"),
    (7 * 86400, "7 days"),
    (30 * 86400, "30 days"),
)


def _expiry_options() -> str:
    options = [(str(s), label) for s, label in EXPIRY_CHOICES]
    return "".join(
        f'<option value="{value}">{label}</option>'
        for value, label in [("", "server default"), *options]
    )


def render(page: str, *, open_mode: bool, price_per_1k: float) -> str:
    """The shell of ``page`` (``batches`` or ``batch``): layout plus the page's main part."""
    main = Template(_static(f"{page}.html")).substitute(expiry_options=_expiry_options())
    values = {
        "page": page,
        "auth": "open" if open_mode else "key",
        "price": repr(float(price_per_1k)),
        "title": "Batches" if page == "batches" else "Batch",
        "main": main,
    }
    return Template(_static("layout.html")).substitute(
        {k: v if k == "main" else html.escape(v) for k, v in values.items()}
    )


def console_router(api: ApiConfig, *, open_mode: bool) -> APIRouter:
    """The console's routes; the shells are rendered once, they hold no one's data."""
    router = APIRouter(include_in_schema=False)
    shells = {
        page: render(page, open_mode=open_mode, price_per_1k=api.price_per_1k_tokens)
        for page in ("batches", "batch")
    }
    no_store = {**HEADERS, "Cache-Control": "no-store"}

    @router.get("/")
    def batches_page() -> HTMLResponse:
        return HTMLResponse(shells["batches"], headers=no_store)

    @router.get("/batches/{batch_id}")
    def batch_page(batch_id: str) -> HTMLResponse:
        # the script reads the id from the path and asks the API; 404s come from there
        return HTMLResponse(shells["batch"], headers=no_store)

    @router.get("/console/{name}")
    def asset(name: str) -> Response:
        media = ASSETS.get(name)
        if media is None:
            raise not_found("console file", name)
        return Response(
            _static(name), media_type=media, headers={**HEADERS, "Cache-Control": "no-cache"}
        )

    return router
