"""The console's shells and files: a strict CSP, no inline script, labelled controls, and
every element the script looks up present on the page that uses it."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from batchpipe.api.console import ASSETS, EXPIRY_CHOICES, console_router
from batchpipe.api.errors import ApiError
from batchpipe.api.retention import MAX_EXPIRES_AFTER_S, MIN_EXPIRES_AFTER_S
from worker.config import ApiConfig


class _Page(HTMLParser):
    """What the tests check of a page: ids, labels, controls, scripts, inline code."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.label_for: set[str] = set()
        self.controls: list[dict[str, str | None]] = []
        self.scripts: list[dict[str, str | None]] = []
        self.inline: list[str] = []
        self.meta: dict[str, str] = {}
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        if tag == "label" and found.get("for"):
            self.label_for.add(str(found["for"]))
        if tag in ("input", "select", "textarea"):
            self.controls.append(found)
        if tag == "script":
            self.scripts.append(found)
            self._in_script = True
        if tag == "meta" and found.get("name"):
            self.meta[str(found["name"])] = str(found.get("content"))
        self.inline += [name for name in found if name == "style" or name.startswith("on")]

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False if tag == "script" else self._in_script

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline.append(f"script: {data.strip()[:40]}")


def _client(*, open_mode: bool = False, price: float = 0.0) -> TestClient:
    app = FastAPI()
    app.include_router(console_router(ApiConfig(price_per_1k_tokens=price), open_mode=open_mode))

    @app.exception_handler(ApiError)
    async def refused(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    return TestClient(app)


def _page(client: TestClient, path: str) -> _Page:
    response = client.get(path)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    parsed = _Page()
    parsed.feed(response.text)
    return parsed


@pytest.mark.parametrize("path", ["/", "/batches/batch_123"])
def test_shell_has_a_strict_csp_and_no_inline_code(path: str) -> None:
    response = _client().get(path)
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert "frame-ancestors 'none'" in csp and "form-action 'none'" in csp
    assert response.headers["cache-control"] == "no-store"
    page = _page(_client(), path)
    assert page.inline == []
    assert [s.get("src") for s in page.scripts] == ["/console/console.js"]


@pytest.mark.parametrize("path", ["/", "/batches/batch_123"])
def test_every_control_has_a_label(path: str) -> None:
    page = _page(_client(), path)
    assert page.controls
    unlabelled = [c for c in page.controls if c.get("id") not in page.label_for]
    assert unlabelled == []


def test_every_element_the_script_looks_up_is_on_its_page() -> None:
    script = _client().get("/console/console.js").text
    wanted = set(re.findall(r'\$\("([a-z-]+)"\)', script))
    assert {"api-key", "bar", "batches", "cancel", "create-form"} <= wanted
    on_pages = _page(_client(), "/").ids | _page(_client(), "/batches/b").ids
    assert wanted - on_pages == set()


def test_auth_mode_and_price_are_the_only_settings_rendered() -> None:
    keyed = _page(_client(price=0.06), "/").meta
    assert keyed["batchpipe-auth"] == "key"
    assert keyed["batchpipe-price-per-1k"] == "0.06"
    assert _page(_client(open_mode=True), "/").meta["batchpipe-auth"] == "open"


@pytest.mark.parametrize("name", sorted(ASSETS))
def test_assets_are_served_with_their_media_type(name: str) -> None:
    response = _client().get(f"/console/{name}")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith(ASSETS[name])
    assert response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("name", ["layout.html", "..%2Fconsole.py", "nope.js"])
def test_only_the_listed_assets_are_served(name: str) -> None:
    response = _client().get(f"/console/{name}")
    assert response.status_code == 404
    assert "import" not in response.text and "<html" not in response.text


def test_the_script_never_puts_the_key_in_a_url_or_parses_html() -> None:
    script = _client().get("/console/console.js").text
    assert "innerHTML" not in script and "eval(" not in script
    assert "sessionStorage" in script and "localStorage" not in script
    assert re.search(r"headers\.Authorization = `Bearer \$\{k\}`", script)


def test_expiry_choices_are_within_the_apis_bounds() -> None:
    assert all(MIN_EXPIRES_AFTER_S <= s <= MAX_EXPIRES_AFTER_S for s, _ in EXPIRY_CHOICES)
    shell = _client().get("/").text
    assert shell.count('<option value="3600">1 hour</option>') == 2  # input and results
