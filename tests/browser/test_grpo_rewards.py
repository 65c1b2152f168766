"""GRPO in Debian's Chromium against the shared stack (issue 26 item 5): a Python reward function written
in the new-job page, tried on sample completions paired with the prompt dataset's rows ("Test rewards"),
then a short GRPO run launched whose reward chart gets its points. Tiny on purpose: 2 steps, groups of 2,
completions of 8 tokens."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from browser_helpers import chart_points, expect_heading, jsonl, launch_from_review, shot, signed_in_page, wait_until

TRAINING_TIMEOUT = 600  # seconds: the built-in model's import on first use, then two tiny CPU steps
PROMPTS = [{"prompt": f"What is {i} plus {i}?", "answer": str(2 * i)} for i in range(6)]
SOURCE = ("def reward(prompts, completions, answer, **columns):\n"
          "    return [1.0 if a in c else 0.0 for c, a in zip(completions, answer)]\n")


@pytest.fixture(scope="module")
def page(stack, chromium):
    yield from signed_in_page(chromium, stack.url)


@pytest.mark.timeout(900)
def test_write_a_reward_function_test_it_and_watch_the_reward_chart(stack, page):
    dataset = page.context.request.post(f"{stack.url}/api/datasets?filename=sums-prompts.jsonl", data=jsonl(PROMPTS),
                                        headers={"Content-Type": "application/octet-stream"})
    assert dataset.ok, dataset.text()
    assert dataset.json()["format"] == "prompt", dataset.json()
    page.goto(stack.url + "/jobs/new")
    expect_heading(page, "New fine-tune")
    page.get_by_role("radio", name=re.compile("^GRPO")).check()
    page.get_by_label("Dataset", exact=True).select_option(str(dataset.json()["id"]))
    page.get_by_label("Quick").check()
    page.get_by_label("Max steps").fill("2")
    page.get_by_label("Batch size").fill("2")
    page.get_by_label("Max sequence length").fill("64")
    page.get_by_label("Group size").fill("2")
    page.get_by_label("Max completion length").fill("8")
    page.get_by_label("KL coefficient").fill("0")  # no reference forward
    page.get_by_text("Advanced").click()
    page.get_by_label("Gradient accumulation").fill("1")
    page.get_by_label("Before/after evaluation").uncheck()
    page.get_by_label("Evaluation share").fill("0")
    page.get_by_label("Gradient checkpointing").uncheck()  # nothing to save at 64 tokens: no recompute

    page.get_by_label("Kind of reward 1").select_option("python")
    page.get_by_label("Code of reward 1").fill(SOURCE)
    # Two completions, paired in turn with the dataset's first two rows (answers 0 and 2).
    page.get_by_label("Sample completions").fill("0 plus 0 is 0.\n---\nI do not know.")
    page.get_by_role("button", name="Test rewards").click()
    rows = page.get_by_test_id("reward-test-rows").locator("tbody tr")
    expect(rows).to_have_count(2, timeout=30_000)
    expect(rows.nth(0)).to_contain_text("What is 0 plus 0?")
    expect(rows.nth(0).locator("td").last).to_have_text(re.compile(r"^1(\.0+)?$"))
    expect(rows.nth(1).locator("td").last).to_have_text(re.compile(r"^0(\.0+)?$"))
    shot(page, "grpo-rewards-tested", full_page=True)

    page.get_by_role("button", name="Review").click()
    launch_from_review(page)
    job_url = f"{stack.url}/api{page.url.removeprefix(stack.url)}"

    def reward_points() -> int:
        job = page.context.request.get(job_url).json()
        assert job["status"] != "failed", job["error"]
        chart = page.get_by_test_id("chart-grpo-reward")  # drawn from the first logged reward on
        return chart_points(page, "chart-grpo-reward") if chart.count() else 0

    wait_until(lambda: reward_points() >= 1, TRAINING_TIMEOUT, "the reward chart's first point")
    expect(page.get_by_test_id("grpo-completions")).to_be_visible()
    wait_until(lambda: reward_points() >= 2, 120, "both steps' rewards on the chart")
    shot(page, "grpo-rewards-charted", full_page=True)
    # Ended before the next module's jobs use the stack's one worker.
    wait_until(lambda: page.context.request.get(job_url).json()["status"] == "succeeded", 120, "the run's end")
