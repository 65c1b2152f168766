"""What the browser tests share: Chromium's launch, the admin account, a signed-in context, screenshots."""
from __future__ import annotations

import json
import time
from pathlib import Path

from collections.abc import Iterator

from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
VIEWPORT = {"width": 1280, "height": 800}
ADMIN = {"email": "ada@lanner.test", "display_name": "Ada Admin", "password": "correct horse 42"}


def launch(playwright) -> Browser:
    return playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)


def sign_in_context(browser: Browser, url: str) -> BrowserContext:
    """A browser context whose session cookie belongs to the admin (created first if no user exists)."""
    context = browser.new_context(viewport=VIEWPORT, accept_downloads=True)
    if context.request.get(f"{url}/api/setup").json()["needed"]:
        response = context.request.post(f"{url}/api/setup", data=ADMIN)
    else:
        response = context.request.post(f"{url}/api/auth/sign-in",
                                        data={"email": ADMIN["email"], "password": ADMIN["password"]})
    assert response.ok, response.text()
    return context


def signed_in_page(url: str) -> Iterator[Page]:
    """A page of a signed-in browser that accepts every confirm dialog (for a module-scoped fixture)."""
    with sync_playwright() as playwright:
        browser = launch(playwright)
        page = sign_in_context(browser, url).new_page()
        page.on("dialog", lambda dialog: dialog.accept())
        yield page
        browser.close()


def shot(page: Page, name: str, full_page: bool = False) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=full_page)


def jsonl(rows: list) -> bytes:
    return "\n".join(row if isinstance(row, str) else json.dumps(row) for row in rows).encode() + b"\n"


def qa_rows(count: int) -> list[dict]:
    return [{"instruction": f"What is {i} plus {i}?", "output": f"{i} plus {i} is {2 * i}."} for i in range(count)]


def chart_points(page: Page, test_id: str) -> int:
    return int(page.get_by_test_id(test_id).get_attribute("data-points") or 0)


def wait_until(condition, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def expect_heading(page: Page, name: str, timeout: float = 10_000) -> None:
    expect(page.get_by_role("heading", level=1, name=name)).to_be_visible(timeout=timeout)
