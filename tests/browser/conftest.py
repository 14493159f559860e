"""A real browser for admin tests: Playwright driving the machine's Chromium, headless.

Playwright's own browser download does not work on our machines, so the tests use the Debian
`chromium` package (`.ci/run` installs it). Where no Chromium can be found the tests skip and
say why, so `make test` still passes on a machine without one; with CI=true that skip is a
failure (tests/conftest.py).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
# Chromium's background services try to reach Google's hosts, which a closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def chromium_path() -> str:
    path = shutil.which("chromium")
    if path is None:
        pytest.skip("no Chromium on PATH: install Debian's chromium package to run browser tests")
    return path


@pytest.fixture
def browser_page(chromium_path: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A fresh page in a headless Chromium; the test's ORM calls stay allowed while it runs."""
    sync_api = pytest.importorskip("playwright.sync_api")
    # Playwright's sync API runs an event loop in this thread; Django would then refuse ORM calls
    # from the test body, which are synchronous and safe here.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS
        )
        page = browser.new_page(viewport={"width": 1600, "height": 1000})
        yield page
        browser.close()


@pytest.fixture
def screenshot() -> Any:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)

    def save(page: Any, name: str) -> Path:
        path = SCREENSHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save
