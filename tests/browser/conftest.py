"""The browser tests' shared parts: one Chromium for the session (each module opens its own context in
it), and one sweep of two short LoRA runs that the sweep page's test watches and the compare and
export tests use, so that those runs are trained once."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect, sync_playwright

from browser_helpers import fill_lr_sweep, jsonl, launch, launch_from_review, qa_rows, shot, sign_in_context


@pytest.fixture(scope="session")
def chromium():
    # Playwright's sync API runs one instance per thread: the modules share it.
    with sync_playwright() as playwright:
        browser = launch(playwright)
        yield browser
        browser.close()


@pytest.fixture(scope="session")
def lr_sweep(stack, chromium):
    """A sweep launched from the new-job page, its runs' learning rates 1e-4 and 1e-3 (not waited for):
    its id and its runs' job ids."""
    context = sign_in_context(chromium, stack.url)
    page = context.new_page()
    dataset = context.request.post(f"{stack.url}/api/datasets?filename=sums.jsonl", data=jsonl(qa_rows(8)),
                                   headers={"Content-Type": "application/octet-stream"})
    assert dataset.ok, dataset.text()
    dataset_id = dataset.json()["id"]
    fill_lr_sweep(page, stack.url, dataset_id, "1e-4, 1e-3")
    sweep_id = launch_from_review(page, "Launch sweep")
    expect(page.get_by_test_id("sweep-ranking").get_by_role("row")).to_have_count(3)  # the header and two runs
    shot(page, "sweep-started", full_page=True)
    job_ids = context.request.get(f"{stack.url}/api/sweeps/{sweep_id}").json()["job_ids"]
    context.close()
    return {"id": sweep_id, "dataset_id": dataset_id, "jobs": job_ids}
