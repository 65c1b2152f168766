"""How a job's stored spec becomes the training options: which weights a method trains, its default
learning rate, and the smaller micro-batch an out-of-memory retry takes (no training here)."""
from __future__ import annotations

import pytest

from lanner.core.spec import DEFAULT_LEARNING_RATE, JobSpec, load_spec, stored_config
from lanner.worker.training.memory import smaller_micro_batch
from lanner.worker.training.options import training_options

from job_specs import stored_spec


def options(method: str, spec: dict | None = None):
    return training_options(load_spec(stored_spec(method, overrides=spec, gpus=1)))


@pytest.mark.parametrize("method, lora, adapter", [
    ("lora", None, True), ("qlora", None, True), ("lora_fp8", None, True), ("full", None, False), ("pretrain", None, False),
    ("dpo", None, False), ("dpo", {"rank": 8}, True), ("orpo", None, False), ("kto", {"rank": 4}, True),
])
def test_the_api_config_says_which_weights_train_and_the_learning_rate(method, lora, adapter):
    spec = JobSpec(method=method, model="builtin/SmolLM2-135M-Instruct", dataset_id=1, gpus=1,
                   **({"lora": lora} if lora else {}))
    trainer_options = training_options(load_spec(stored_config(spec)))
    assert (trainer_options.method, trainer_options.lora) == (method, adapter)
    assert (trainer_options.load_in_4bit, trainer_options.load_in_fp8) == (method == "qlora", method == "lora_fp8")
    assert trainer_options.learning_rate == DEFAULT_LEARNING_RATE[method]


def test_a_spec_without_a_learning_rate_gets_the_methods_default():
    assert options("full").learning_rate == DEFAULT_LEARNING_RATE["full"]
    assert options("full", {"hyperparameters": {"learning_rate": 3e-4}}).learning_rate == 3e-4
    assert options("kto", {"lora": {"rank": 8}}).lora
    assert not options("kto", {"lora": None}).lora


@pytest.mark.parametrize("method, micro_batch, accumulation, expected", [
    ("lora", 8, 1, (4, 2)), ("lora", 4, 3, (2, 6)), ("lora", 6, 1, (3, 2)), ("lora", 3, 2, (1, 6)),
    ("lora", 1, 4, None), ("kto", 4, 1, (2, 2)), ("kto", 2, 1, None), ("kto", 3, 1, None),
])
def test_the_retry_halves_the_micro_batch_and_keeps_the_effective_batch(method, micro_batch, accumulation, expected):
    smaller = smaller_micro_batch(options(method, {"hyperparameters": {"batch_size": micro_batch,
                                                                        "gradient_accumulation": accumulation}}))
    if expected is None:
        assert smaller is None
        return
    assert (smaller.per_device_train_batch_size, smaller.gradient_accumulation_steps) == expected
    assert smaller.per_device_train_batch_size * smaller.gradient_accumulation_steps == micro_batch * accumulation


def test_kto_with_a_micro_batch_of_one_is_refused_before_training():
    assert options("kto", {"hyperparameters": {"batch_size": 1}}).problem().startswith(
        "KTO needs a micro-batch (per_device_train_batch_size) of 2 or more")
    assert options("dpo", {"hyperparameters": {"batch_size": 1}}).problem() is None


def test_the_prompt_limit_reaches_the_preference_methods():
    spec = JobSpec(method="dpo", model="builtin/SmolLM2-135M-Instruct", dataset_id=1, gpus=1,
                   preference={"max_prompt_len": 64})
    assert training_options(load_spec(stored_config(spec))).max_prompt_len == 64


def test_long_prompts_keep_their_end(smollm2_dir):
    from transformers import AutoTokenizer

    from lanner.worker.training.common import truncate_prompts

    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    text = " ".join(f"word{i}" for i in range(200)) + " the question?"
    conversation = [{"role": "system", "content": "Be brief."}]
    conversation += [{"role": role, "content": f"turn {i} " + "filler " * 30}
                     for i, role in enumerate(["user", "assistant"] * 3)]
    conversation.append({"role": "user", "content": "the question?"})
    rows = [{"prompt": text, "chosen": "a", "rejected": "b"}, {"prompt": conversation, "chosen": "a", "rejected": "b"},
            {"prompt": "short", "chosen": "a", "rejected": "b"}]

    kept = truncate_prompts(rows, tokenizer, 48)
    assert len(tokenizer(kept[0]["prompt"], add_special_tokens=False)["input_ids"]) <= 48
    assert kept[0]["prompt"].endswith("the question?") and kept[0]["chosen"] == "a"
    assert [m["content"] for m in kept[1]["prompt"]] == ["Be brief.", "the question?"]
    assert kept[2] == rows[2] and truncate_prompts(rows, tokenizer, None) is rows


def test_a_gpu_without_fp8_fails_a_lora_fp8_job_in_words_before_loading(monkeypatch):
    from lanner.kernels.ops.fp8_matmul import FP8Unsupported, fp8_unsupported_message
    from lanner.kernels.quant import loading
    from lanner.worker.job_process import JobFailed
    from lanner.worker.training.model import _fp8_lora_model

    def no_fp8(device):  # what fp8_backend says on an A100
        raise FP8Unsupported(fp8_unsupported_message("NVIDIA A100-SXM4-80GB", (8, 0)))

    monkeypatch.setattr(loading, "fp8_backend", no_fp8)
    with pytest.raises(JobFailed, match=r"^FP8 needs compute capability 8\.9 or newer \(Ada/Hopper\); this GPU is "
                                        r"NVIDIA A100-SXM4-80GB \(8\.0\)\. Train with lora"):
        _fp8_lora_model("/no/checkpoint/is/read", options("lora_fp8"))
