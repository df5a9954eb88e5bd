"""The console in a real browser: headless Debian Chromium driven by Playwright.

A batch owner signs in with an API key, uploads a file and creates a batch, watches it
reach ``completed``, downloads its output, then watches a second batch's latest answers
while the echo worker (paced) is still running it, cancels it and reads its error
summary. Another key sees none of
it, and the key never appears in a URL. A batch with engine failures is retried from its
page ("Retry failed lines"), and the new batch completes. With ``--no-auth`` there is no
sign-in and the console's calls pass the open server's Host and Origin checks.
Screenshots go to the test's tmp dir (``console-*.png``).

Needs Chromium at :data:`CHROMIUM` (``apt-get install chromium``; ``.ci/run`` installs it)
and the ``playwright`` package (the ``dev`` extra); Playwright's own browser download is
never used.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests

from batchpipe.api.app import Server
from batchpipe.api.auth import Keys
from tests.integration.api.conftest import Serve, sdk
from tests.integration.api.test_cancel_restart import slow
from tests.integration.api.test_retry import Flaky, line
from tests.integration.api.test_sdk_echo import batch_file, wait_for
from tests.integration.harness import running_worker
from worker.config import Config

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
WAIT_MS = 90_000
PRICE = 0.06

if not CHROMIUM.exists():
    pytest.skip(
        f"no Chromium at {CHROMIUM}: install Debian's chromium (apt-get install chromium) "
        "to run the console's browser test; .ci/run installs it",
        allow_module_level=True,
    )
pytest.importorskip("playwright.sync_api", reason="playwright (the dev extra) drives Chromium")
from playwright.sync_api import (  # noqa: E402 (after the skips: it may be absent)
    Browser,
    ConsoleMessage,
    Page,
    Request,
    expect,
    sync_playwright,
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Watched:
    """A page whose requests and console errors are recorded for the assertions."""

    def __init__(self, browser: Browser) -> None:
        self.context = browser.new_context(
            accept_downloads=True, viewport={"width": 1280, "height": 800}
        )
        self.page = self.context.new_page()
        self.urls: list[str] = []
        self.api_auth: list[str | None] = []
        self.problems: list[str] = []
        self.page.on("request", self._request)
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda e: self.problems.append(str(e)))

    def _console(self, message: ConsoleMessage) -> None:
        # the browser logs every 4xx answer; the API's refusals are expected here
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.problems.append(message.text)  # a script error or a CSP violation

    def _request(self, request: Request) -> None:
        self.urls.append(request.url)
        if "/v1/" in request.url:
            self.api_auth.append(request.headers.get("authorization"))


def _create(page: Page, source: Path, **expiry: str) -> str:
    """Upload ``source`` and create a batch from the list page (``expiry``: the labels of
    the input and results expiry choices, and of the tier); the new batch's id."""
    page.set_input_files("#batch-file", str(source))
    page.select_option("#endpoint", "/v1/chat/completions")
    for name, label in expiry.items():
        page.get_by_label(name).select_option(label=label)
    page.get_by_role("button", name="Upload and create").click()
    status = page.locator("#create-status")
    expect(status).to_contain_text("Created batch", timeout=WAIT_MS)
    text = status.inner_text()
    return text.removeprefix("Created batch ").rstrip(".")


def _download(page: Page, button: str, target: Path) -> list[dict[str, Any]]:
    with page.expect_download(timeout=WAIT_MS) as info:
        page.get_by_role("button", name=button).click()
    info.value.save_as(target)
    return [json.loads(line) for line in target.read_text().splitlines()]


def test_owner_signs_in_creates_watches_downloads_and_cancels(
    api_config: Config, serve: Serve, browser: Browser, tmp_path: Path
) -> None:
    config = slow(replace(api_config, api=replace(api_config.api, price_per_1k_tokens=PRICE)))
    small = batch_file(tmp_path / "small.jsonl", 6, "small")
    large = batch_file(tmp_path / "large.jsonl", 120, "large")
    with serve(config) as server, running_worker(config):
        alice = Watched(browser)
        page = alice.page
        page.goto(f"{server.url}/")
        expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
        page.get_by_label("API key").fill("sk-wrong")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#sign-in-error")).to_contain_text("Incorrect API key")
        page.get_by_label("API key").fill("sk-alice")
        page.get_by_role("button", name="Sign in").click()
        expect(page.get_by_role("heading", name="Batches", exact=True)).to_be_visible()

        first = _create(
            page,
            small,
            **{
                "Input file expires after": "1 hour",
                "Results expire after": "1 day",
                "Tier": "priority: before the other batches",
            },
        )
        row = page.locator(f'tr[data-batch-id="{first}"]')
        expect(row).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        bar = row.locator("progress")
        expect(bar).to_have_attribute("value", "6")
        expect(bar).to_have_attribute("max", "6")
        expect(row).to_contain_text("6 / 0 / 6")
        expect(row.locator("td").nth(2)).to_have_text("priority")  # the tier asked for
        cost = row.locator("td").nth(6).inner_text()
        assert float(cost) > 0, cost  # tokens × PRICE / 1000

        row.get_by_role("link", name=first).click()
        expect(page.locator("#batch-status")).to_have_text("completed", timeout=WAIT_MS)
        expect(page.locator("#batch-fields")).to_contain_text("Tierpriority")
        output = _download(page, "Download output", tmp_path / "output.jsonl")
        assert sorted(line["custom_id"] for line in output) == sorted(
            f"small-{i}" for i in range(6)
        )
        expect(page.get_by_role("button", name="Cancel batch")).to_be_disabled()
        files = page.locator("#batch-files")
        expect(files).to_contain_text("small.jsonl")
        expect(files).to_contain_text(f"{first}_output.jsonl")
        times = files.locator("time")  # the input's and the output's expires_at
        expect(times).to_have_count(2)
        input_expiry, output_expiry = (int(t.get_attribute("data-unix") or 0) for t in times.all())
        assert output_expiry - input_expiry > 20 * 3600  # 1 day from later vs 1 hour
        # the input deleted (or expired): the batch page still shows the batch
        gone = requests.delete(
            f"{server.url}/v1/files/{done_input(server, first)}",
            headers={"Authorization": "Bearer sk-alice"},
            timeout=30,
        )
        assert gone.status_code == 200, gone.text
        page.reload()
        expect(page.locator("#batch-status")).to_have_text("completed", timeout=WAIT_MS)
        expect(files).to_contain_text("gone (expired or deleted)")
        expect(page.get_by_role("button", name="Download output")).to_be_enabled()

        page.get_by_role("link", name="All batches").click()
        second = _create(page, large)
        page.locator(f'tr[data-batch-id="{second}"]').get_by_role("link").click()
        expect(page.locator("#batch-status")).to_have_text("in_progress", timeout=WAIT_MS)
        # live progress: the bar moves while the worker runs the batch
        page.wait_for_function("() => document.getElementById('bar').value > 0", timeout=WAIT_MS)
        # partial answers of the running batch: its latest lines, newest first, refreshed
        answers = page.locator("#latest-answers tbody tr")
        expect(answers.first).to_have_attribute("data-outcome", "completed", timeout=WAIT_MS)
        expect(answers.first).to_contain_text("large-")
        expect(answers.first).to_contain_text("hello")  # the echo engine's answer text
        expect(page.locator("#answers-note")).to_contain_text("refreshed while the batch runs")
        page.screenshot(path=tmp_path / "console-partial.png", full_page=True)
        page.get_by_role("button", name="Cancel batch").click()
        expect(page.locator("#batch-status")).to_have_text("cancelled", timeout=WAIT_MS)
        # the cancel's 4005 lines are the latest answers now, among the ones that ran
        stopped = page.locator('#latest-answers tbody tr[data-outcome="error"]')
        expect(stopped.first).to_contain_text("error 4005", timeout=WAIT_MS)
        summary = page.locator("#error-summary")
        expect(summary).to_be_visible(timeout=WAIT_MS)
        expect(summary.locator("tbody th").first).to_have_text("4005")
        page.screenshot(path=tmp_path / "console-batch.png", full_page=True)
        errors = _download(page, "Download errors", tmp_path / "errors.jsonl")
        assert errors and {line["error"]["code"] for line in errors} == {"4005"}
        page.get_by_role("link", name="All batches").click()
        rows = page.locator("#batches tbody tr")
        expect(rows).to_have_count(2)
        expect(rows.first).to_have_attribute("data-status", "cancelled")  # newest first
        page.screenshot(path=tmp_path / "console-batches.png", full_page=True)

        assert not any("sk-alice" in url for url in alice.urls)
        assert alice.api_auth and all(a == "Bearer sk-alice" for a in alice.api_auth[1:])
        assert alice.problems == []

        bob = Watched(browser)
        bob.page.goto(f"{server.url}/batches/{first}")
        bob.page.get_by_label("API key").fill("sk-bob")
        bob.page.get_by_role("button", name="Sign in").click()
        expect(bob.page.locator("#batch-error")).to_contain_text("No such batch")
        bob.page.get_by_role("link", name="All batches").click()
        expect(bob.page.locator("#empty")).to_be_visible()
        assert bob.page.locator("#batches tbody tr").count() == 0
        assert bob.problems == []


def test_no_auth_console_needs_no_sign_in(
    api_config: Config, serve: Serve, browser: Browser, tmp_path: Path
) -> None:
    with serve(api_config, Keys({}, open=True)) as server, running_worker(api_config):
        local = Watched(browser)
        page = local.page
        page.goto(f"{server.url}/")
        expect(page.locator("#who-name")).to_have_text("Local (no API keys)")
        expect(page.locator("#sign-in")).to_be_hidden()
        batch = _create(page, batch_file(tmp_path / "in.jsonl", 3))
        row = page.locator(f'tr[data-batch-id="{batch}"]')
        expect(row).to_have_attribute("data-status", "completed", timeout=WAIT_MS)
        assert local.api_auth and all(a is None for a in local.api_auth)
        assert local.problems == []


def done_input(server: Server, batch_id: str) -> str:
    """The input file id of alice's batch ``batch_id``, read through the API."""
    answer = requests.get(
        f"{server.url}/v1/batches/{batch_id}",
        headers={"Authorization": "Bearer sk-alice"},
        timeout=30,
    )
    file_id: str = answer.json()["input_file_id"]
    return file_id


def test_retry_button_makes_a_batch_of_the_engine_failures(
    api_config: Config, serve: Serve, browser: Browser, tmp_path: Path
) -> None:
    source = tmp_path / "flaky.jsonl"
    kinds = {"ok-0": "hello", "boom-0": "boom 0", "boom-1": "boom 1", "bad-0": "bad input"}
    source.write_text("".join(line(k, v) for k, v in kinds.items()))
    with serve(api_config) as server:
        client = sdk(server)
        file = client.files.create(file=source.open("rb"), purpose="batch")
        first = client.batches.create(
            input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h"
        ).id
        with running_worker(api_config, Flaky(broken=True)):
            wait_for(client, first, {"completed"})
        alice = Watched(browser)
        page = alice.page
        page.goto(f"{server.url}/batches/{first}")
        page.get_by_label("API key").fill("sk-alice")
        page.get_by_role("button", name="Sign in").click()
        expect(page.locator("#batch-status")).to_have_text("completed", timeout=WAIT_MS)
        page.get_by_role("button", name="Retry failed lines").click()
        status = page.locator("#action-status")
        expect(status).to_contain_text("2 lines retried as batch", timeout=WAIT_MS)
        expect(status).to_contain_text("Not retried: bad-0 (4002)")
        second = status.get_by_role("link").inner_text()
        page.reload()  # another click (the key stays in the tab): the same batch again
        expect(page.locator("#batch-status")).to_have_text("completed", timeout=WAIT_MS)
        page.get_by_role("button", name="Retry failed lines").click()
        expect(status).to_contain_text(f"Already retried as batch {second}", timeout=WAIT_MS)
        with running_worker(api_config, Flaky(broken=False)):
            status.get_by_role("link").click()
            expect(page.locator("#batch-id")).to_have_text(second)
            expect(page.locator("#batch-status")).to_have_text("completed", timeout=WAIT_MS)
        expect(page.locator("#batch-fields")).to_contain_text(f'"batchpipe_retry_of":"{first}"')
        expect(page.get_by_role("button", name="Retry failed lines")).to_be_disabled()
        assert alice.problems == []


def test_a_batch_page_shows_its_spend_against_its_cap(
    api_config: Config, serve: Serve, browser: Browser, tmp_path: Path
) -> None:
    """Issue 50: a batch capped at 60 tokens (about two of its 40 lines) shows what it spent
    against the cap, then that the cap stopped it, the lines not run answered 4008."""
    config = slow(api_config)
    with serve(config) as server, running_worker(config):
        client = sdk(server)
        file = client.files.create(
            file=batch_file(tmp_path / "capped.jsonl", 40, "capped").open("rb"), purpose="batch"
        )
        capped = client.batches.create(
            input_file_id=file.id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"batchpipe_max_tokens": "60"},
        ).id
        alice = Watched(browser)
        page = alice.page
        page.goto(f"{server.url}/batches/{capped}")
        page.get_by_label("API key").fill("sk-alice")
        page.get_by_role("button", name="Sign in").click()
        spend = page.locator("#spend")
        expect(spend).to_contain_text(" of 60 tokens (", timeout=WAIT_MS)
        expect(page.locator("#batch-status")).to_have_text("cancelled", timeout=WAIT_MS)
        expect(spend).to_contain_text("cap reached", timeout=WAIT_MS)
        expect(spend).to_contain_text("(4008)")
        expect(page.locator("#batch-errors")).to_contain_text("batch_cap_reached")
        summary = page.locator("#error-summary")
        expect(summary).to_be_visible(timeout=WAIT_MS)
        expect(summary.locator("tbody th").first).to_have_text("4008")
        page.screenshot(path=tmp_path / "console-capped.png", full_page=True)
        assert alice.problems == []
