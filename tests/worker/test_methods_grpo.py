"""GRPO on the real SmolLM2 on the CPU through the training process: tiny settings, a built-in reward
and a user's function run in the reward sandbox; its metrics and sampled completions on the events."""
from __future__ import annotations

import json

from job_specs import merged
from training_run import events, logs, run_train_process, step_metrics, trained

PROMPTS = [{"prompt": f"What is {i} plus {i}? Answer with a number.", "answer": str(2 * i)} for i in range(4)]
# 20 rows: enough for a held-out share (MIN_ROWS_FOR_VALIDATION).
PROMPTS_20 = [{**row, "prompt": f"{row['prompt']} ({copy})"} for copy in range(5) for row in PROMPTS]
USER_REWARD = """
def reward(prompts, completions, answer, **columns):
    return [float(a in c) for c, a in zip(completions, answer)]
"""
GRPO = {"hyperparameters": {"max_steps": 2, "max_seq_len": 64, "eval_fraction": 0.0},
        "grpo": {"num_generations": 2, "max_completion_len": 8, "samples_logged": 2,
                 "reward_functions": [{"kind": "regex", "pattern": r"\d"},
                                      {"kind": "python", "name": "contains_answer", "source": USER_REWARD,
                                       "weight": 2.0}]}}


def test_grpo_trains_an_adapter_and_streams_rewards_and_samples(studio):
    # A micro-batch of 1 x 2 accumulation steps holds one group; the evaluation batch holds a whole one too.
    held_out = merged(GRPO, {"hyperparameters": {"batch_size": 1, "gradient_accumulation": 2, "eval_fraction": 0.1}})
    job_id = studio.job(studio.dataset("prompts.jsonl", PROMPTS_20), held_out, method="grpo")
    trained(studio, job_id)
    metrics = step_metrics(studio, job_id)
    evaluation = [data for _, kind, data in events(studio, job_id) if kind == "metric" and "eval_loss" in data]
    assert [m["step"] for m in evaluation] == [2] and "eval_reward" in evaluation[0]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        for key in ("reward", "reward_std", "rewards/regex/mean", "rewards/contains_answer/mean",
                    "rewards/contains_answer/std", "kl", "completions/mean_length", "frac_reward_zero_std"):
            assert key in m, key
        assert 0 < m["completions/mean_length"] <= 8
        assert m["generation_time"] > 0 and m["training_time"] >= 0
    samples = [data for _, kind, data in events(studio, job_id) if kind == "completions"]
    assert [s["step"] for s in samples] == [1, 2]
    assert all(len(s["samples"]) == 2 and set(s["samples"][0]["rewards"]) == {"regex", "contains_answer"}
               for s in samples)
    assert "(LoRA)" in next(line for line in logs(studio, job_id) if line.startswith("Model "))
    adapter = studio.data_dir / "artifacts" / str(job_id) / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    assert not (adapter / "ref").exists()  # TRL's frozen reference copy is not part of the download


def test_a_failing_reward_function_fails_the_job_with_its_traceback(studio):
    broken = merged(GRPO, {"hyperparameters": {"max_steps": 1}, "grpo": {"reward_functions": [
        {"kind": "python", "source": "def reward(prompts, completions, **columns):\n    return [1 / 0]\n"}]}})
    job_id = studio.job(studio.dataset("prompts.jsonl", PROMPTS), broken, method="grpo")
    result = run_train_process(studio, job_id)
    assert result.returncode == 1
    error = next(line for line in logs(studio, job_id) if "ZeroDivisionError" in line)
    assert error.startswith("Reward function python: ZeroDivisionError") and 'File "<reward python>", line 2, in reward' in error


def test_grpo_over_a_4bit_base_trains_a_qlora_adapter(studio):
    quantized = merged(GRPO, {"hyperparameters": {"max_steps": 1}, "grpo": {"load_in_4bit": True}})
    job_id = studio.job(studio.dataset("prompts.jsonl", PROMPTS), quantized, method="grpo", gpus=1)
    trained(studio, job_id)
    assert "reward" in step_metrics(studio, job_id)[0]
    assert "(LoRA over a 4-bit NF4 base)" in next(line for line in logs(studio, job_id) if line.startswith("Model "))
    record = json.loads((studio.data_dir / "artifacts" / str(job_id) / "adapter" / "lanner_training.json").read_text())
    assert (record["method"], record["quantization"]["quant_type"]) == ("grpo", "nf4")
