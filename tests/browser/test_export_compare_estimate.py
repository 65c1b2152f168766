"""Export, compare and the new-job insights in Debian's Chromium against the real stack. Two short
LoRA runs on the built-in SmolLM2 (the session's lr_sweep, conftest.py) feed the tests, and a dataset:
the new-job page shows the memory estimate and whether it fits the worker, the dataset preview with
the trained tokens highlighted and the token-length histogram with the rows a short max length
cuts, and says plainly that hub search is offline; the compare page overlays both runs and marks
the setting that differs; an export started from the job page shows its own progress, then its
verified files with sizes and downloads, which the artifacts page lists too."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from browser_helpers import expect_heading, jsonl, shot, signed_in_page, wait_until

TRAINING_TIMEOUT = 1500  # seconds: importing SmolLM2 on first use, then two short CPU runs on shared cores


def _rows() -> list[dict]:
    # Ten short questions and answers (well under 256 tokens with the chat template) and two long
    # answers (well over), the first of them first so that the preview shows it cut.
    long = {"instruction": "Count to three hundred.", "output": " ".join(str(n) for n in range(1, 301))}
    return [long] + [{"instruction": f"What is {i} plus {i}?", "output": f"{i} plus {i} is {2 * i}."}
                     for i in range(10)] + [long]


@pytest.fixture(scope="module")
def page(stack, chromium):
    yield from signed_in_page(chromium, stack.url)


@pytest.fixture(scope="module")
def counting(stack, page) -> int:
    """An uploaded dataset with rows a short max length cuts (its id)."""
    dataset = page.context.request.post(f"{stack.url}/api/datasets?filename=counting.jsonl", data=jsonl(_rows()),
                                        headers={"Content-Type": "application/octet-stream"})
    assert dataset.ok, dataset.text()
    return dataset.json()["id"]


@pytest.fixture(scope="module")
def runs(stack, page, lr_sweep) -> list[int]:
    """Two finished LoRA runs that differ in their learning rate (the sweep's, trained once for the session)."""
    request = page.context.request
    jobs = []

    def finished():
        jobs[:] = [request.get(f"{stack.url}/api/jobs/{i}").json() for i in lr_sweep["jobs"]]
        failed = [j for j in jobs if j["status"] in ("failed", "cancelled")]
        assert not failed, failed
        return all(j["status"] == "succeeded" for j in jobs)

    try:
        wait_until(finished, TRAINING_TIMEOUT, "both training runs to succeed", interval=2)
    except AssertionError as error:
        states = [(j["id"], j["status"], j["step"], j["error"]) for j in jobs]
        raise AssertionError(f"{error}: {states}\n" + "".join(stack.output[-40:])) from None
    return lr_sweep["jobs"]


@pytest.mark.timeout(1800)
def test_the_new_job_page_estimates_memory_and_previews_the_dataset(stack, page, counting, runs):
    # Waits for the runs: by then the built-in model is imported and the worker idle.
    page.goto(stack.url + "/jobs/new")
    expect_heading(page, "New fine-tune")
    estimate = page.get_by_test_id("memory-estimate")
    expect(estimate.get_by_test_id("estimate-total")).to_have_text(re.compile(r"^\d+\.\d GiB$"), timeout=15_000)
    # The stack's one worker is a CPU worker; the form picks the CPU when there is no GPU.
    expect(estimate.get_by_test_id("estimate-fits").get_by_role("row", name=re.compile("cpu"))).to_contain_text("fits")

    page.get_by_label("Dataset", exact=True).select_option(str(counting))
    preview = page.get_by_test_id("dataset-preview")
    # Rendered through the chat template: the answers highlighted as trained, the prompt as context.
    # The first preview loads the tokenizer into the API process: slow on a busy machine.
    samples = preview.get_by_role("article")
    expect(samples.nth(1).locator("mark.trained")).to_contain_text("0 plus 0 is 0.", timeout=120_000)
    expect(samples.first.locator("mark.trained")).to_contain_text("1 2 3 4 5")
    expect(samples.nth(1)).to_contain_text("What is 0 plus 0?")
    expect(samples.nth(1).locator("mark.trained")).not_to_contain_text("What is")
    stats = page.get_by_test_id("token-stats")
    expect(stats.get_by_test_id("truncation")).to_have_text(re.compile(r"^All 12 rows fit in 2048 tokens"))
    expect(stats.get_by_test_id("length-histogram").locator(".histogram__cut:not([style*='height: 0%'])")).to_have_count(0)
    page.get_by_label("Max sequence length").fill("256")
    expect(stats.get_by_test_id("truncation")).to_have_text(
        re.compile(r"^2 of 12 rows are longer than 256 tokens and would be cut"))
    expect(stats.get_by_test_id("length-histogram").locator(".histogram__cut:not([style*='height: 0%'])")).to_have_count(1)
    expect(samples.first).to_contain_text("cut at the max length", timeout=15_000)
    shot(page, "new-job-insights", full_page=True)

    page.get_by_label("Search the hub").check()
    page.get_by_label("Search the model hub").fill("qwen instruct")
    page.get_by_role("button", name="Search", exact=True).click()
    expect(page.get_by_test_id("hub-offline")).to_contain_text("Offline", timeout=30_000)


def test_the_compare_page_overlays_runs_and_marks_what_differs(stack, page, runs):
    first, second = runs
    page.goto(stack.url + "/compare")
    expect_heading(page, "Compare")
    page.get_by_role("checkbox", name=f"Compare job {first}").check()
    page.get_by_role("checkbox", name=f"Compare job {second}").check()
    expect(page).to_have_url(re.compile(rf"jobs={first}(%2C|,){second}"))
    expect(page.get_by_test_id("compare-loss")).to_have_attribute("data-points", "2", timeout=15_000)
    expect(page.get_by_test_id("compare-lr")).to_have_attribute("data-points", "2")
    settings = page.get_by_test_id("compare-settings")
    rate = settings.get_by_role("row", name=re.compile(r"hyperparameters\.learning_rate"))
    expect(rate).to_have_attribute("data-differs", "true")
    expect(rate).to_contain_text("0.001")
    expect(settings.get_by_role("row", name=re.compile(r"hyperparameters\.max_seq_len"))).not_to_have_attribute(
        "data-differs", "true")
    shot(page, "compare", full_page=True)
    page.get_by_label(re.compile(r"Only the \d+ that differ")).check()
    expect(settings.get_by_role("row", name=re.compile(r"hyperparameters\.max_seq_len"))).to_have_count(0)


@pytest.mark.timeout(1500)
def test_an_export_shows_its_progress_then_its_verified_files(stack, page, runs, tmp_path):
    job_id = runs[0]
    page.goto(f"{stack.url}/jobs/{job_id}")
    expect(page.get_by_test_id("job-status")).to_have_text("succeeded", timeout=15_000)
    expect(page.get_by_test_id("checkpoints").get_by_role("row", name=re.compile(r"checkpoint-2"))).to_be_visible()

    panel = page.get_by_test_id(f"export-panel-{job_id}")
    panel.get_by_label("LoRA adapter").uncheck()
    panel.get_by_role("checkbox", name="q8_0").uncheck()  # the merged model alone: GGUF needs llama.cpp
    panel.get_by_role("button", name="Export").click()
    export = panel.get_by_test_id("export-job").first
    expect(export).to_be_visible()

    # Its own progress, from its own stream: stages and a percentage while it runs.
    seen = set()
    read = """el => [el.querySelector('[data-testid=export-status]')?.textContent,
                     el.querySelector('[data-testid=export-stage]')?.textContent,
                     el.querySelector('[data-testid=export-percent]')?.textContent]"""

    def done():
        status, stage, percent = export.evaluate(read)
        if stage and percent:
            seen.add((stage, percent))
        assert status not in ("failed", "cancelled"), export.inner_text()
        return status == "succeeded"

    wait_until(done, 600, "the export to succeed", interval=0.2)
    stages = {stage for stage, _ in seen}
    assert any(stage.startswith(("Merging", "Verifying")) for stage in stages), seen
    assert any(0 < int(percent.rstrip("%")) < 100 for _, percent in seen), seen

    files = export.get_by_test_id("export-artifacts")
    expect(files).to_contain_text("Merged model", timeout=30_000)
    expect(files.get_by_test_id("artifact-size").first).to_have_text(re.compile(r"\d+(\.\d)? MB"))
    expect(files.get_by_test_id("verification").first).to_contain_text("verified")
    shot(page, "job-exported", full_page=True)
    files.get_by_text(re.compile(r"^\d+ files$")).first.click()
    with page.expect_download() as download_info:
        files.get_by_role("link", name="config.json", exact=True).click()
    saved = tmp_path / "config.json"
    download_info.value.save_as(saved)
    assert '"model_type"' in saved.read_text()

    page.goto(stack.url + "/artifacts")
    section = page.get_by_test_id(f"job-artifacts-{job_id}")
    expect(section.get_by_test_id("export-artifacts")).to_contain_text("Merged model", timeout=15_000)
    expect(section.get_by_role("button", name="Export")).to_be_enabled()
    shot(page, "artifacts", full_page=True)
