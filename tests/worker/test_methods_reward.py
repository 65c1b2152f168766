"""Reward-model training on the real SmolLM2 on the CPU, a few steps, then its model as a GRPO reward."""
from __future__ import annotations

import json
import math

import pytest

from lanner.core.settings import Settings

from training_run import events, logs, step_metrics, trained

# Polite, on-topic answers against rude refusals: a difference a few steps can learn.
PAIRS = [{"prompt": f"What is {i} plus {i}?", "chosen": f"{i} plus {i} is {2 * i}.",
          "rejected": "No. Go away, I will not answer that."} for i in range(24)]
REWARD = {"hyperparameters": {"max_steps": 6, "eval_fraction": 0.25, "eval_steps": 6, "save_steps": 6,
                              "gradient_checkpointing": True}}
PROMPTS = [{"prompt": f"What is {i} plus {i}?"} for i in range(2)]


def test_reward_training_reports_held_out_accuracy_and_scores_completions_for_grpo(studio):
    job_id = studio.job(studio.dataset("pairs.jsonl", PAIRS), REWARD, method="reward")
    trained(studio, job_id)
    evaluation = [data for _, kind, data in events(studio, job_id) if kind == "metric" and "eval_loss" in data]
    assert "not a causal LM" in " ".join(logs(studio, job_id))
    # Six held-out pairs all the right way round, and a loss far below an untrained head's ln 2.
    assert evaluation[-1]["eval_accuracy"] == 1.0 and evaluation[-1]["eval_loss"] < 0.5 * math.log(2)
    folder = studio.data_dir / "artifacts" / str(job_id) / "adapter"
    record = json.loads((folder / "lanner_training.json").read_text())
    assert (record["method"], record["saved"]) == ("reward", "adapter")

    import torch

    from lanner.core.rewards.sandbox import SandboxLimits
    from lanner.worker.training.grpo import JobRewards
    from lanner.worker.training.reward_scoring import RewardModelScorer

    scorer = RewardModelScorer(job_id, Settings(data_dir=studio.data_dir), torch.float32, 64)
    rewards = JobRewards([{"kind": "regex", "pattern": r"\d"}, {"kind": "reward_model", "job_id": job_id}],
                         [], SandboxLimits(), {job_id: scorer})
    # As GRPO passes a prompt dataset's rows: conversations, each completion the assistant's message.
    prompts = [[{"role": "user", "content": "What is 50 plus 50?"}]] * 2
    completions = [[{"role": "assistant", "content": text}]
                   for text in ("50 plus 50 is 100.", "No. Go away, I will not answer that.")]
    regex, model = rewards.scores(prompts, completions, {})
    assert regex == [1.0, 0.0]
    # The trained margin on the held-out pairs was over 2; an untrained score head's is near 0.
    assert model[0] - model[1] > 1

    # A GRPO job of the same studio with the reward model as one of its weighted reward functions.
    grpo = {"hyperparameters": {"max_steps": 1, "eval_fraction": 0.0},
            "grpo": {"num_generations": 2, "max_completion_len": 8, "samples_logged": 2, "reward_functions": [
                {"kind": "reward_model", "name": "judge", "job_id": job_id, "weight": 0.5}]}}
    grpo_id = studio.job(studio.dataset("prompts.jsonl", PROMPTS), grpo, method="grpo")
    trained(studio, grpo_id)
    step = step_metrics(studio, grpo_id)[0]
    assert step["rewards/judge/mean"] != 0 and step["reward"] == pytest.approx(0.5 * step["rewards/judge/mean"])


def test_a_reward_model_of_every_weight_is_saved_whole_and_scores(studio):
    whole = {"hyperparameters": {"max_steps": 2, "eval_fraction": 0.0, "gradient_checkpointing": True}, "lora": None}
    job_id = studio.job(studio.dataset("pairs.jsonl", PAIRS[:4]), whole, method="reward")
    trained(studio, job_id)
    assert "(reward model: every weight)" in next(line for line in logs(studio, job_id) if line.startswith("Model "))
    assert [m["step"] for m in step_metrics(studio, job_id)] == [1, 2]

    import torch

    from lanner.worker.training.reward_scoring import RewardModelScorer

    scorer = RewardModelScorer(job_id, Settings(data_dir=studio.data_dir), torch.float32, 64)
    assert type(scorer.model).__name__ == "LlamaForSequenceClassification"
    scores = scorer([[{"role": "user", "content": "Hi"}]] * 9, [[{"role": "assistant", "content": "Hello"}]] * 9)
    assert len(scores) == 9 and max(scores) - min(scores) < 1e-4  # two forward passes (8 + 1), one answer
