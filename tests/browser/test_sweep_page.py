"""A sweep in Debian's Chromium against the real stack: started from the new-job page (lr_sweep, in
conftest.py; a value the server refuses is marked on its row), then its page ranks the two short runs as
they finish, marks the best and draws their loss curves together; a run's page and the queue page lead
back to it."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from browser_helpers import LAUNCH_TIMEOUT_MS, chart_points, fill_lr_sweep, shot, signed_in_page, wait_until

TRAINING_TIMEOUT = 1500  # seconds: importing SmolLM2 on first use, then two 2-step CPU runs on shared cores


@pytest.fixture(scope="module")
def page(stack, chromium):
    yield from signed_in_page(chromium, stack.url)


@pytest.mark.timeout(1800)
def test_start_a_sweep_and_open_its_page(stack, page, lr_sweep):
    # The launch that the server refuses; lr_sweep launched the same form with valid values.
    fill_lr_sweep(page, stack.url, lr_sweep["dataset_id"], "1e-4, 5")
    page.get_by_role("button", name="Launch sweep").click()
    panel = page.get_by_test_id("sweep-panel")
    expect(panel.get_by_role("alert")).to_contain_text("hyperparameters.learning_rate = 5: Input should be less than "
                                                       "or equal to 1", timeout=LAUNCH_TIMEOUT_MS)

    page.goto(f"{stack.url}/sweeps/{lr_sweep['id']}")
    ranking = page.get_by_test_id("sweep-ranking")
    expect(ranking.get_by_role("row")).to_have_count(3)  # the header and two runs
    expect(ranking).to_contain_text("0.001")
    expect(page.get_by_test_id("sweep-status")).to_have_text("succeeded", timeout=TRAINING_TIMEOUT * 1000)
    best = ranking.locator("tr[data-best]")
    expect(best).to_have_count(1, timeout=15_000)
    expect(best).to_contain_text("★ best")
    expect(best.locator("td").first).to_have_text(re.compile(r"^1"))
    wait_until(lambda: chart_points(page, "sweep-loss") >= 2, 30, "both runs' loss on the chart")
    shot(page, "sweep-finished", full_page=True)
    best.get_by_role("link").click()
    expect(page.get_by_test_id("job-sweep")).to_contain_text("A run of sweep #")
    page.get_by_test_id("job-sweep").get_by_role("link").click()
    expect(page).to_have_url(re.compile(r"/sweeps/\d+$"))
    sweep_id = page.url.rsplit("/", 1)[1]
    page.get_by_role("link", name="Queue").first.click()
    expect(page.get_by_test_id("sweeps").get_by_role("row", name=re.compile(f"#{sweep_id}"))).to_contain_text(
        "2 succeeded")
