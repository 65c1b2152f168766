"""How a job's config becomes the training options: which weights a method trains, its default
learning rate, and the smaller micro-batch an out-of-memory retry takes (no training here)."""
from __future__ import annotations

import pytest

from lanner.backend.schemas.jobs import DEFAULT_LEARNING_RATE, JobSpec, job_config
from lanner.worker.training.memory import smaller_micro_batch
from lanner.worker.training.options import TrainingOptions


@pytest.mark.parametrize("method, lora, adapter", [
    ("lora", None, True), ("qlora", None, True), ("full", None, False), ("pretrain", None, False),
    ("dpo", None, False), ("dpo", {"rank": 8}, True), ("orpo", None, False), ("kto", {"rank": 4}, True),
])
def test_the_api_config_says_which_weights_train_and_the_learning_rate(method, lora, adapter):
    spec = JobSpec(method=method, model="builtin/SmolLM2-135M-Instruct", dataset_id=1, gpus=1,
                   **({"lora": lora} if lora else {}))
    options = TrainingOptions.from_config(job_config(spec))
    assert (options.method, options.lora) == (method, adapter)
    assert options.learning_rate == DEFAULT_LEARNING_RATE[method]


def test_a_config_without_a_learning_rate_gets_the_methods_default():
    assert TrainingOptions.from_config({}, "full").learning_rate == DEFAULT_LEARNING_RATE["full"]
    assert TrainingOptions.from_config({"learning_rate": 3e-4}, "full").learning_rate == 3e-4
    assert TrainingOptions.from_config({"lora_r": 8}, "kto").lora
    assert not TrainingOptions.from_config({"lora_r": None}, "kto").lora


@pytest.mark.parametrize("method, micro_batch, accumulation, expected", [
    ("lora", 8, 1, (4, 2)), ("lora", 4, 3, (2, 6)), ("lora", 6, 1, (3, 2)), ("lora", 3, 2, (1, 6)),
    ("lora", 1, 4, None), ("kto", 4, 1, (2, 2)), ("kto", 2, 1, None), ("kto", 3, 1, None),
])
def test_the_retry_halves_the_micro_batch_and_keeps_the_effective_batch(method, micro_batch, accumulation, expected):
    options = TrainingOptions.from_config({"per_device_train_batch_size": micro_batch,
                                           "gradient_accumulation_steps": accumulation}, method)
    smaller = smaller_micro_batch(options)
    if expected is None:
        assert smaller is None
        return
    assert (smaller.per_device_train_batch_size, smaller.gradient_accumulation_steps) == expected
    assert smaller.per_device_train_batch_size * smaller.gradient_accumulation_steps == micro_batch * accumulation


def test_kto_with_a_micro_batch_of_one_is_refused_before_training():
    assert TrainingOptions.from_config({"per_device_train_batch_size": 1}, "kto").problem().startswith(
        "KTO needs a micro-batch (per_device_train_batch_size) of 2 or more")
    assert TrainingOptions.from_config({"per_device_train_batch_size": 1}, "dpo").problem() is None
