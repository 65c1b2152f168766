"""The main path through the studio in Debian's Chromium against the real stack: first-run setup,
sign-out and sign-in, API tokens, a dataset upload with its report, a LoRA job on the built-in
SmolLM2 watched live (charts grow, a reload brings them back whole), and the adapter downloaded.

Runs before test_shell.py (file order), so it is the one that meets the first-run setup page."""
from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from browser_helpers import (ADMIN, VIEWPORT, chart_points, expect_heading, jsonl, launch_from_review, qa_rows, shot,
                             wait_until)

TRAINING_TIMEOUT = 600  # seconds: the first job imports SmolLM2 from its GGUF, then trains on 2 shared cores


@pytest.fixture(scope="module")
def page(chromium):
    context = chromium.new_context(viewport=VIEWPORT, accept_downloads=True)
    page = context.new_page()
    page.on("dialog", lambda dialog: dialog.accept())
    yield page
    context.close()


def test_first_run_setup_then_sign_out_and_in(stack, page):
    page.goto(stack.url + "/jobs/new")
    if page.context.request.get(stack.url + "/api/setup").json()["needed"]:
        expect(page).to_have_url(stack.url + "/setup")
        expect_heading(page, "Set up Lanner")
        page.get_by_role("button", name="Create administrator").click()
        expect(page.get_by_text("Enter an email address.")).to_be_visible()  # inline validation
        page.get_by_label("Email").fill(ADMIN["email"])
        page.get_by_label("Your name").fill(ADMIN["display_name"])
        page.get_by_label("Password", exact=True).fill(ADMIN["password"])
        page.get_by_label("Password again").fill(ADMIN["password"])
        shot(page, "setup")
        page.get_by_role("button", name="Create administrator").click()
    else:  # another test file ran first and made the admin: sign in, to land on the queue
        page.goto(stack.url + "/")
        page.get_by_label("Email").fill(ADMIN["email"])
        page.get_by_label("Password").fill(ADMIN["password"])
        page.get_by_role("button", name="Sign in").click()
    expect_heading(page, "Queue")
    expect(page.get_by_role("button", name=re.compile("Ada Admin"))).to_be_visible()

    page.get_by_role("button", name=re.compile("Ada Admin")).click()
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/signin"))
    page.goto(stack.url + "/datasets")  # signed out: sent to sign-in, and back here afterwards
    expect(page).to_have_url(re.compile(r"/signin\?next=%2Fdatasets"))
    page.get_by_label("Email").fill(ADMIN["email"])
    page.get_by_label("Password").fill("wrong password")
    page.get_by_role("button", name="Sign in").click()
    expect(page.get_by_role("alert")).to_have_text("Wrong email or password.")
    shot(page, "signin")
    page.get_by_label("Password").fill(ADMIN["password"])
    page.get_by_role("button", name="Sign in").click()
    expect_heading(page, "Datasets")


def test_api_tokens_are_shown_once_listed_and_revoked(stack, page):
    page.goto(stack.url + "/")
    page.get_by_role("button", name=re.compile("Ada Admin")).click()
    page.get_by_role("link", name="API tokens").click()
    expect_heading(page, "API tokens")
    page.get_by_label("Token name").fill("ci script")
    page.get_by_role("button", name="Create token").click()
    secret = page.get_by_test_id("new-token").locator("code").inner_text()
    assert len(secret) > 20
    # The token works as a bearer token for the API.
    answer = page.context.request.get(stack.url + "/api/me", headers={"Authorization": f"Bearer {secret}"})
    assert answer.ok and answer.json()["email"] == ADMIN["email"]
    row = page.get_by_role("row", name=re.compile("ci script"))
    expect(row).to_contain_text("active")
    shot(page, "tokens")
    row.get_by_role("button", name=re.compile("Revoke")).click()
    expect(row).to_contain_text("revoked")
    answer = page.context.request.get(stack.url + "/api/me", headers={"Authorization": f"Bearer {secret}"})
    assert answer.status == 401


# Importing SmolLM2 and a few CPU steps take well over the default 900 s on two shared cores.
@pytest.mark.timeout(1800)
def test_upload_launch_watch_reload_and_download(stack, page, tmp_path):
    data = tmp_path / "additions.jsonl"
    # 16 rows: few steps on shared CPU cores whether or not the worker honours max_steps.
    data.write_bytes(jsonl(qa_rows(16) + ["this line is not json"]))

    page.goto(stack.url + "/")
    page.get_by_role("link", name="New fine-tune").first.click()
    expect_heading(page, "New fine-tune")
    page.get_by_test_id("dataset-file").set_input_files(data)
    report = page.get_by_test_id("dataset-report").first
    expect(report.get_by_test_id("report-usable")).to_have_text("16", timeout=30_000)
    expect(report.get_by_test_id("report-rows")).to_have_text("17")
    expect(report.get_by_test_id("report-bad")).to_have_text("1")
    expect(report.get_by_test_id("report-format")).to_contain_text("alpaca")
    expect(report.get_by_role("row", name=re.compile(r"^17 "))).to_be_visible()  # the bad row, by line number
    expect(page.get_by_label("Dataset", exact=True)).to_have_value(re.compile(r"^\d+$"))
    shot(page, "new-job-dataset", full_page=True)

    # Inline validation, then a short run: the quick preset, few steps, small batches, short sequences.
    page.get_by_label("Quick").check()
    page.get_by_label("Max sequence length").fill("8")
    expect(page.get_by_text("Must be at least 16.")).to_be_hidden()  # not before the first review
    page.get_by_role("button", name="Review").click()
    expect(page.get_by_text("Must be at least 16.")).to_be_visible()
    page.get_by_label("Max sequence length").fill("128")
    page.get_by_label("Max steps").fill("4")
    page.get_by_label("Batch size").fill("2")
    page.get_by_text("Advanced").click()
    page.get_by_label("Gradient checkpointing").uncheck()  # nothing to save at these lengths: no recompute
    page.get_by_label("Before/after evaluation").uncheck()  # minutes of generation nothing here checks
    page.get_by_role("button", name="Review").click()
    summary = page.get_by_test_id("job-summary")
    expect(summary).to_contain_text("builtin/SmolLM2-135M-Instruct")
    expect(summary).to_contain_text("LoRA")
    shot(page, "new-job-summary", full_page=True)
    job_id = launch_from_review(page)

    # Live: the loss and tokens/s charts grow while the job runs.
    wait_until(lambda: chart_points(page, "chart-loss") >= 2, TRAINING_TIMEOUT, "two loss points")
    first = chart_points(page, "chart-loss")
    assert chart_points(page, "chart-tps") >= 2
    status = page.get_by_test_id("job-status").inner_text()
    if status == "running":
        wait_until(lambda: chart_points(page, "chart-loss") > first, 400, "the loss chart to grow")
    shot(page, "job-running", full_page=True)

    # A reload mid-run: the charts come back whole (replayed from the start), then keep going.
    before = chart_points(page, "chart-loss")
    page.reload()
    wait_until(lambda: chart_points(page, "chart-loss") >= before, 30, "the replayed loss chart")
    assert chart_points(page, "chart-tps") >= 2

    expect(page.get_by_test_id("job-status")).to_have_text("succeeded", timeout=TRAINING_TIMEOUT * 1000)
    job = page.context.request.get(f"{stack.url}/api/jobs/{job_id}").json()
    wait_until(lambda: chart_points(page, "chart-loss") >= job["step"], 30, "every step on the chart")
    expect(page.get_by_test_id("job-log")).to_contain_text("Adapter saved")

    # The adapter, downloaded and checked.
    artifacts = page.get_by_test_id("artifacts")
    expect(artifacts).to_contain_text("LoRA adapter", timeout=30_000)
    with page.expect_download() as download_info:
        artifacts.get_by_role("link", name="adapter_config.json").click()
    saved = tmp_path / "adapter_config.json"
    download_info.value.save_as(saved)
    config = json.loads(saved.read_text())
    assert config["peft_type"] == "LORA"
    with page.expect_download() as download_info:
        artifacts.get_by_role("link", name="adapter_model.safetensors").click()
    weights = tmp_path / "adapter_model.safetensors"
    download_info.value.save_as(weights)
    assert weights.stat().st_size > 10_000
    shot(page, "job-finished", full_page=True)

    page.get_by_role("link", name="Queue").first.click()
    finished = page.get_by_test_id("finished-jobs")
    expect(finished.get_by_role("row", name=re.compile(f"#{job_id}"))).to_contain_text("succeeded")
    shot(page, "queue-finished")


def test_datasets_and_models_pages_list_what_exists(stack, page):
    page.goto(stack.url + "/datasets")
    expect(page.get_by_test_id("datasets")).to_contain_text("additions")
    shot(page, "datasets")
    page.goto(stack.url + "/models")
    expect(page.get_by_role("table", name="Built-in model")).to_contain_text("SmolLM2-135M-Instruct")
    shot(page, "models")
