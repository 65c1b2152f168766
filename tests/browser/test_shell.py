"""Debian's Chromium opens the studio served by the real stack and finds the app's shell."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from browser_helpers import shot, signed_in_page


@pytest.fixture(scope="module")
def page(stack, chromium):
    # Every page but setup and sign-in needs a session now: sign in (or set up) through the API.
    yield from signed_in_page(chromium, stack.url)


def test_the_shell_shows_the_queue_and_a_healthy_studio(stack, page):
    page.goto(stack.url + "/")
    expect(page.get_by_role("heading", name="Queue", exact=True)).to_be_visible()
    expect(page.get_by_test_id("health-status")).to_have_text("ok", timeout=15_000)
    expect(page.get_by_test_id("workers")).to_contain_text("cpu0")
    shot(page, "queue")


def test_the_router_navigates_and_survives_a_reload(stack, page):
    page.goto(stack.url + "/")
    page.get_by_role("link", name="New fine-tune").first.click()
    expect(page).to_have_url(stack.url + "/jobs/new")
    page.goto(stack.url + "/datasets")
    expect(page.get_by_role("heading", name="Datasets", exact=True)).to_be_visible()
    page.goto(stack.url + "/no/such/page")
    expect(page.get_by_text("not found", exact=False).first).to_be_visible()
    shot(page, "not-found")
