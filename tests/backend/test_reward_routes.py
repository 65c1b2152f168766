"""GRPO through the API: the spec's refusals in words, a job on a prompt dataset, and the route that
tries reward functions in the sandbox before launch."""
from __future__ import annotations

import json

import pytest

from lanner.core.memory_estimate import estimate_memory
from lanner.core.spec import REWARD_SOURCE_LIMIT, JobSpec

from backend_helpers import CHAT_ROWS, upload

MODEL = "builtin/SmolLM2-135M-Instruct"
PROMPTS = "".join(json.dumps({"prompt": f"What is {i} plus {i}?", "answer": str(2 * i)}) + "\n" for i in range(3))
USER = "def reward(prompts, completions, answer, **columns):\n    return [float(a in c) for c, a in zip(completions, answer)]\n"


def grpo(dataset_id: int, *functions: dict, **settings) -> dict:
    return {"method": "grpo", "model": MODEL, "dataset_id": dataset_id,
            "grpo": {"reward_functions": list(functions), **settings}}


@pytest.mark.parametrize("functions, settings, words", [
    ([{"kind": "bleu"}], {}, "Input should be 'exact_match', 'numeric_match', 'regex', 'length_penalty', "
                             "'json_schema', 'python' or 'reward_model'"),
    ([{"kind": "regex", "pattern": "(unclosed"}], {}, "pattern '(unclosed' is not a regular expression"),
    ([{"kind": "python", "source": "x" * (REWARD_SOURCE_LIMIT + 1)}], {},
     f"String should have at most {REWARD_SOURCE_LIMIT} characters"),
    ([{"kind": "python", "source": "def score(p, c):\n    return []\n"}], {}, "must define a function reward("),
    ([{"kind": "python", "source": "def reward(:"}], {}, "the code does not parse"),
    ([{"kind": "regex"}], {}, "a regex reward function needs pattern"),
    ([{"kind": "exact_match", "pattern": "x"}], {}, "pattern does not apply to a exact_match reward function"),
    ([{"kind": "regex", "pattern": "x", "job_id": 3}], {}, "job_id does not apply to a regex reward function"),
    ([{"kind": "reward_model"}], {}, "a reward_model reward function needs job_id"),
    ([{"kind": "reward_model", "job_id": "3"}], {}, "Input should be a valid integer"),
    ([{"kind": "exact_match"}, {"kind": "exact_match"}], {}, "two reward functions are called exact_match"),
    ([], {}, "List should have at least 1 item"),
    ([{"kind": "exact_match"}], {"num_generations": 3}, "must be a multiple of num_generations (3)"),
    ([{"kind": "exact_match"}], {"load_in_4bit": True}, "grpo's load_in_4bit needs a GPU"),
])
def test_a_grpo_spec_that_cannot_work_is_refused_in_words(team, functions, settings, words):
    refused = team.alice.post("/api/jobs", json={**grpo(1, *functions, **settings), "gpus": 0})
    assert refused.status_code == 422, refused.text
    assert any(words in error["msg"] for error in refused.json()["detail"]), refused.json()


def test_the_estimate_of_grpo_over_a_4bit_base_counts_nf4_weights():
    def weights(load_in_4bit: bool) -> int:
        spec = JobSpec.model_validate(grpo(1, {"kind": "exact_match"}, load_in_4bit=load_in_4bit))
        return estimate_memory(spec, {"parameters": 8_000_000_000}, "cuda")["weights_bytes"]

    assert weights(True) < weights(False) / 3


def test_a_grpo_job_needs_a_prompt_dataset_and_stores_its_defaults(team):
    prompts = upload(team.alice, "prompts.jsonl", PROMPTS).json()
    assert (prompts["format"], prompts["usable_rows"]) == ("prompt", 3)
    chat = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    refused = team.alice.post("/api/jobs", json=grpo(chat, {"kind": "exact_match"}))
    assert refused.status_code == 422 and "grpo needs a prompt dataset" in refused.text
    missing = team.alice.post("/api/jobs", json={"method": "grpo", "model": MODEL, "dataset_id": prompts["id"]})
    assert missing.status_code == 422 and "grpo needs a grpo section" in missing.text
    job = team.alice.post("/api/jobs", json=grpo(prompts["id"], {"kind": "exact_match"}))
    assert job.status_code == 201, job.text
    config = job.json()["config"]
    assert config["grpo"]["num_generations"] == 4 and config["grpo"]["reward_functions"][0]["column"] == "answer"
    assert config["lora"]["rank"] == 16


def test_reward_functions_are_tried_on_sample_completions_in_the_sandbox(team):
    prompts = upload(team.alice, "prompts.jsonl", PROMPTS).json()["id"]
    tried = team.alice.post("/api/rewards/test", json={
        "dataset_id": prompts, "completions": ["It is 0.", "It is 3.", "2"],
        "reward_functions": [{"kind": "python", "name": "mine", "source": USER, "weight": 2},
                             {"kind": "numeric_match"}]})
    assert tried.status_code == 200, tried.text
    rows = tried.json()["rows"]
    assert [row["prompt"] for row in rows] == ["What is 0 plus 0?", "What is 1 plus 1?", "What is 2 plus 2?"]
    assert [row["rewards"] for row in rows] == [{"mine": 1.0, "numeric_match": 1.0}, {"mine": 0.0, "numeric_match": 0.0},
                                                {"mine": 0.0, "numeric_match": 0.0}]
    assert [row["total"] for row in rows] == [3.0, 0.0, 0.0]

    failed = team.alice.post("/api/rewards/test", json={
        "completions": ["x"], "reward_functions": [{"kind": "python", "source": USER}]}).json()
    assert failed["rows"] == [] and failed["failure"]["function"] == "python"
    assert "TypeError" in failed["failure"]["message"] and "answer" in failed["failure"]["message"]
    assert failed["failure"]["traceback"].startswith("Traceback (most recent call last):")

    chat = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    wrong = team.alice.post("/api/rewards/test", json={"dataset_id": chat, "completions": ["x"],
                                                       "reward_functions": [{"kind": "exact_match"}]})
    assert wrong.status_code == 422 and "reward functions are tried on a prompt dataset" in wrong.text


def test_a_prompt_dataset_previews_its_prompts_with_nothing_trained(team, allowed_smollm2):
    prompts = upload(team.alice, "prompts.jsonl", PROMPTS).json()["id"]
    shown = team.alice.get(f"/api/datasets/{prompts}/preview", params={"model": str(allowed_smollm2), "rows": 1})
    assert shown.status_code == 200, shown.text
    row = shown.json()["rows"][0]
    assert row["sequence"] == "prompt" and row["trained_tokens"] == 0 and "What is 0 plus 0?" in row["segments"][0]["text"]
