"""Two flows of the team's workflow in Debian's Chromium against the real stack (issue 27, item 6):
a job's YAML downloaded from its page, changed, uploaded on the new-job page and launched; and a
webhook added on the Notifications page whose test delivery reaches a receiver started here, signed
with the secret the page showed once, and shows as delivered in the page's log. Neither trains: the
jobs are cancelled while queued."""
from __future__ import annotations

import hashlib
import hmac
import json
import re

import pytest
import yaml
from playwright.sync_api import expect

from browser_helpers import expect_heading, jsonl, launch_from_review, qa_rows, shot, signed_in_page
from support import WebhookReceiver

MODEL = "builtin/SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def page(stack, chromium):
    yield from signed_in_page(chromium, stack.url)


def test_download_a_jobs_yaml_upload_it_changed_and_launch(stack, page, tmp_path):
    request = page.context.request
    dataset = request.post(f"{stack.url}/api/datasets?filename=sums.jsonl", data=jsonl(qa_rows(8)),
                           headers={"Content-Type": "application/octet-stream"})
    assert dataset.ok, dataset.text()
    source = request.post(f"{stack.url}/api/jobs", data={
        "method": "lora", "model": MODEL, "dataset_id": dataset.json()["id"], "name": "yaml-source", "gpus": 0,
        "hyperparameters": {"max_steps": 2, "learning_rate": 2e-4}})
    assert source.ok, source.text()
    job_id = source.json()["id"]
    assert request.post(f"{stack.url}/api/jobs/{job_id}/cancel").ok  # its spec is all this test needs

    page.goto(f"{stack.url}/jobs/{job_id}")
    with page.expect_download() as download_info:
        page.get_by_role("link", name="Download YAML").click()
    downloaded = tmp_path / download_info.value.suggested_filename
    download_info.value.save_as(downloaded)
    spec = yaml.safe_load(downloaded.read_text())
    assert spec["name"] == "yaml-source" and spec["hyperparameters"]["learning_rate"] == 2e-4
    spec["name"], spec["hyperparameters"]["learning_rate"] = "from-yaml", 7e-4
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(spec))

    page.goto(f"{stack.url}/jobs/new")
    expect_heading(page, "New fine-tune")
    page.get_by_text("Load a config file (YAML)").click()
    page.locator("#config-file").set_input_files(changed)
    expect(page.get_by_test_id("config-loaded")).to_contain_text("Read as a lanner config.")
    expect(page.get_by_label("Job name (optional)")).to_have_value("from-yaml")
    page.get_by_role("button", name="Review").click()
    expect(page.get_by_test_id("job-summary")).to_contain_text("0.0007")
    shot(page, "yaml-uploaded-summary", full_page=True)
    launch_from_review(page)
    launched = int(page.url.rsplit("/", 1)[1])
    assert launched != job_id
    job = request.get(f"{stack.url}/api/jobs/{launched}").json()
    request.post(f"{stack.url}/api/jobs/{launched}/cancel")
    assert job["name"] == "from-yaml"
    assert job["config"]["hyperparameters"]["learning_rate"] == 7e-4
    assert job["config"]["hyperparameters"]["max_steps"] == 2 and job["dataset_id"] == dataset.json()["id"]


def test_add_a_webhook_and_see_a_delivery(stack, page):
    receiver = WebhookReceiver([204])
    url = receiver.url
    try:
        page.goto(stack.url + "/")
        page.get_by_role("button", name=re.compile("Ada Admin")).click()
        page.get_by_role("link", name="Notifications").click()
        expect_heading(page, "Notifications")
        page.get_by_label("URL", exact=True).fill(url)
        page.get_by_label("Waiting", exact=True).check()
        page.get_by_role("button", name="Add webhook").click()
        secret = page.get_by_test_id("new-webhook").locator("code").first.inner_text()
        assert re.fullmatch(r"[0-9a-f]{64}", secret)

        hook = page.get_by_role("region", name=f"Webhook {url}")
        expect(hook).to_contain_text("finished, failed, waiting")
        expect(hook).to_contain_text("No deliveries yet.")
        hook.get_by_role("button", name="Send test").click()
        log = hook.get_by_test_id(re.compile(r"deliveries-\d+"))
        expect(log.get_by_role("row").nth(1)).to_contain_text("delivered", timeout=15_000)  # the sender, then a refresh
        expect(log).to_contain_text("HTTP 204")
        shot(page, "webhook-delivered", full_page=True)

        [(headers, body)] = receiver.requests
        assert headers["X-Lanner-Signature"] == "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
        assert json.loads(body)["event"] == "test"

        hook.get_by_role("button", name="Delete").click()  # the page's fixture accepts the confirm
        expect(page.get_by_text("No webhooks yet.")).to_be_visible()
    finally:
        receiver.shutdown()
