"""Helpers of the browser tests: the dashboard served over HTTP, Debian's chromium driven
by Playwright, and screenshots (under ``tests/.artifacts/``; with
``CYCLONE_UPDATE_SCREENSHOT=1`` the docs' pictures are replaced too)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from playwright.sync_api import sync_playwright
from werkzeug.serving import make_server

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent.parent
ARTIFACTS = ROOT / "tests" / ".artifacts"
DOCS = ROOT / "docs"


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """``app`` served over HTTP on a free port, in a thread; its base URL."""
    server = make_server("127.0.0.1", 0, app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)


@contextmanager
def chromium(javascript: bool) -> Iterator[Any]:
    """A page of a fresh headless chromium, 1280 by 900, with JavaScript on or off."""
    assert os.path.exists(CHROMIUM), f"{CHROMIUM} is missing: apt-get install chromium"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-dev-shm-usage"],
        )
        context = browser.new_context(
            viewport={"width": 1280, "height": 900}, java_script_enabled=javascript
        )
        yield context.new_page()
        context.close()
        browser.close()


def shot(page: Any, name: str) -> Path:
    """A full-page screenshot, ``tests/.artifacts/dashboard-<name>.png``."""
    path = ARTIFACTS / f"dashboard-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def doc_shot(page: Any, name: str) -> Path:
    """The top of the page, down to the end of its content and at most the viewport's
    height, as ``tests/.artifacts/<name>``; with ``CYCLONE_UPDATE_SCREENSHOT=1`` it also
    replaces the docs' picture ``docs/<name>``."""
    path = ARTIFACTS / name
    viewport = page.viewport_size
    box = page.locator("main").bounding_box()
    height = viewport["height"] if box is None else box["y"] + box["height"] + 24
    clip = {"x": 0, "y": 0, "width": viewport["width"], "height": min(height, viewport["height"])}
    page.screenshot(path=str(path), clip=clip)
    if os.environ.get("CYCLONE_UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(path, DOCS / name)
    return path
