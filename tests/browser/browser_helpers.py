"""What the browser tests share: Chromium's launch, the admin account, a signed-in context, screenshots."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

from collections.abc import Iterator

from playwright.sync_api import Browser, BrowserContext, Page, expect

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "test-artifacts" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]
VIEWPORT = {"width": 1280, "height": 800}
ADMIN = {"email": "ada@lanner.test", "display_name": "Ada Admin", "password": "correct horse 42"}
# A launch's answer: the server checks the spec against the database, the machines and the memory estimate
# before it queues; on a 2-core machine busy training, that once took over Playwright's default 5 s.
LAUNCH_TIMEOUT_MS = 30_000


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


def signed_in_page(browser: Browser, url: str) -> Iterator[Page]:
    """A page of a signed-in context of its own that accepts every confirm dialog (for a module-scoped fixture)."""
    context = sign_in_context(browser, url)
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    yield page
    context.close()


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


def fill_lr_sweep(page: Page, url: str, dataset_id: int, values: str) -> None:
    """The new-job page filled in for a sweep over the learning rate: 2-step LoRA runs at short lengths."""
    page.goto(url + "/jobs/new")
    expect_heading(page, "New fine-tune")
    page.get_by_label("Dataset", exact=True).select_option(str(dataset_id))
    page.get_by_label("Quick").check()
    page.get_by_label("Max steps").fill("2")
    page.get_by_label("Batch size").fill("2")
    page.get_by_label("Max sequence length").fill("64")
    page.get_by_text("Advanced").click()
    page.get_by_label("Before/after evaluation").uncheck()
    page.get_by_label("Run as a sweep").check()
    page.get_by_label("Values of field 1").fill(values)
    expect(page.get_by_test_id("sweep-runs")).to_have_text("2 runs")
    page.get_by_role("button", name="Review").click()
    expect(page.get_by_test_id("job-summary")).to_contain_text("2 runs (grid), ranked by loss")


def launch_from_review(page: Page, button: str = "Launch") -> int:
    """Clicks the review step's launch button and waits for the new job's page (the sweep's, for "Launch
    sweep"): its id."""
    page.get_by_role("button", name=button, exact=True).click()
    kind = "sweeps" if button == "Launch sweep" else "jobs"
    expect(page).to_have_url(re.compile(rf"/{kind}/\d+$"), timeout=LAUNCH_TIMEOUT_MS)
    return int(page.url.rsplit("/", 1)[1])
