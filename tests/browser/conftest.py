"""Browser tests of the operator console: a real ``talaria serve`` process (embedded simulated
node, SQLite) and Debian's Chromium driven by Playwright (``TALARIA_CHROMIUM``, set by
scripts/test.sh through scripts/browser.sh; Playwright's own browser download is not used).

Screenshots go to out/console-screenshots/ (test artifacts); with
``TALARIA_DOCS_SCREENSHOTS=1`` also to docs/console/, where docs/console.md shows them.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, sync_playwright

from bench.harness.processes import ROOT, ServeProcess, talaria_serve
from tests.support import unavailable

ADMIN_TOKEN = "console-test-admin-token"
ARTIFACTS = ROOT / "out" / "console-screenshots"
DOCS_SHOTS = ROOT / "docs" / "console"
TIME_SCALE = "20"
"""The embedded node's clock runs 20× real time: model switches of ~4–6 simulated seconds
take a fraction of a second of the test's time."""


@dataclass(frozen=True)
class Console:
    serve: ServeProcess

    @property
    def url(self) -> str:
        return self.serve.base_url + "/console"


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    data = tmp_path_factory.mktemp("console")
    # The pages explain slot waits and show model switches: the embedded node must switch its
    # two models, so co-residency (which keeps both resident together) is off here.
    env = {"TALARIA_ADMIN_TOKEN": ADMIN_TOKEN, "TALARIA_POLICY": "-co_residency-demand_slots"}
    with talaria_serve(["--time-scale", TIME_SCALE], env, data) as serve:
        yield Console(serve)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    chromium = os.environ.get("TALARIA_CHROMIUM")
    if not chromium:
        unavailable(
            "no Chromium: run scripts/browser.sh and set TALARIA_CHROMIUM",
            under_ci="TALARIA_CHROMIUM is not set (scripts/test.sh sets it under CI)",
        )
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium, headless=True)
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    opened.on(
        "console",
        lambda msg: errors.append(msg.text) if msg.type == "error" else None,
    )
    yield opened
    context.close()
    assert not errors, f"the page logged errors: {errors}"


def screenshot(page: Page, name: str) -> Path:
    """Save a full-page screenshot as a test artifact (and for the docs when asked)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    if os.environ.get("TALARIA_DOCS_SCREENSHOTS") == "1":
        DOCS_SHOTS.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, DOCS_SHOTS / path.name)
    return path


def sign_in(page: Page, console: Console) -> None:
    page.goto(console.url)
    page.get_by_label("Admin token").fill(ADMIN_TOKEN)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Sessions").wait_for()
