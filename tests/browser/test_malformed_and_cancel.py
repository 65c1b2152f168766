"""The unhappy paths in Debian's Chromium against the real stack: a malformed dataset is refused
with a clear reason and its bad lines; a file of the wrong kind is refused; the queue updates live
without a reload; a running job is cancelled from its page."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from browser_helpers import (chart_points, expect_heading, jsonl, qa_rows, shot, signed_in_page,
                             wait_until)


@pytest.fixture(scope="module")
def page(stack, chromium):
    yield from signed_in_page(chromium, stack.url)


def test_a_malformed_dataset_is_refused_with_its_bad_lines(stack, page, tmp_path):
    bad = tmp_path / "broken.jsonl"
    bad.write_bytes(jsonl(["{oops", '{"instruction": "x", "output": ""}', "not json at all"]))
    page.goto(stack.url + "/datasets")
    expect_heading(page, "Datasets")
    page.get_by_test_id("dataset-file").set_input_files(bad)
    error = page.get_by_test_id("upload-error")
    expect(error).to_contain_text("This file cannot be used for training", timeout=30_000)
    expect(error).to_contain_text("line 1")
    shot(page, "dataset-malformed", full_page=True)

    wrong = tmp_path / "notes.txt"
    wrong.write_text("hello")
    page.get_by_test_id("dataset-file").set_input_files(wrong)
    expect(page.get_by_test_id("upload-error")).to_contain_text("This kind of file cannot be used")
    # nothing half-uploaded is listed (the list is absent altogether when this file runs first)
    expect(page.get_by_test_id("datasets").filter(has_text="broken")).to_have_count(0)


@pytest.mark.timeout(1800)
def test_the_queue_updates_live_and_a_running_job_is_cancelled(stack, page):
    request = page.context.request
    dataset = request.post(f"{stack.url}/api/datasets?filename=long.jsonl", data=jsonl(qa_rows(400)),
                           headers={"Content-Type": "application/octet-stream"})
    assert dataset.ok, dataset.text()

    page.goto(stack.url + "/")
    expect_heading(page, "Queue")
    expect(page.get_by_test_id("queue-stream")).to_have_text("live", timeout=15_000)
    job = request.post(f"{stack.url}/api/jobs", data={
        "method": "lora", "model": "builtin/SmolLM2-135M-Instruct", "dataset_id": dataset.json()["id"],
        "name": "to be cancelled", "gpus": 0,
        "hyperparameters": {"max_steps": 200, "max_seq_len": 64, "batch_size": 2, "gradient_accumulation": 1}})
    assert job.status == 201, job.text()
    job_id = job.json()["id"]
    # No reload: the queue stream brings the new job in.
    expect(page.get_by_role("link", name="to be cancelled")).to_be_visible(timeout=15_000)
    shot(page, "queue-live")

    page.get_by_role("link", name="to be cancelled").click()
    expect(page).to_have_url(f"{stack.url}/jobs/{job_id}")
    wait_until(lambda: chart_points(page, "chart-loss") >= 1, 600, "the first step of the job to cancel")
    expect(page.get_by_test_id("job-status")).to_have_text("running")
    page.get_by_role("button", name="Cancel").click()
    expect(page.get_by_test_id("job-status")).to_have_text("cancelled", timeout=90_000)
    shot(page, "job-cancelled", full_page=True)

    page.get_by_role("link", name="Queue").first.click()
    row = page.get_by_test_id("finished-jobs").get_by_role("row", name=re.compile(f"#{job_id}"))
    expect(row).to_contain_text("cancelled")
    expect(row.get_by_role("button", name=f"Retry job {job_id}")).to_be_visible()
