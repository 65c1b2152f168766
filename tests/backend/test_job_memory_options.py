"""The memory options of the job spec (memory_budget_gib, offload_checkpoints, packing): what is
refused and why, what reaches the training process, and the memory estimate under a budget."""
from __future__ import annotations

import pytest

from lanner.core.memory_estimate import estimate_memory
from lanner.core.spec import JobSpec
from lanner.worker.training.options import training_options

from backend_helpers import CHAT_ROWS, upload
from job_specs import unchecked_spec

MODEL = "builtin/SmolLM2-135M-Instruct"
GIB = 2**30
LLAMA_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, vocab_size=128256,
                num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False)


@pytest.mark.parametrize("spec, words", [
    ({"hyperparameters": {"memory_budget_gib": 20, "use_kernels": False}}, "memory_budget_gib: the memory engine is part of lanner.kernels; turn use_kernels on"),
    ({"hyperparameters": {"offload_checkpoints": True, "use_kernels": False}}, "offload_checkpoints: the memory engine is part of lanner.kernels"),
    ({"hyperparameters": {"offload_checkpoints": True, "memory_budget_gib": 8, "gradient_checkpointing": False}},
     "memory_budget_gib and offload_checkpoints: the memory engine plans the gradient checkpointing"),
    ({"method": "full", "hyperparameters": {"memory_budget_gib": 20}}, "runs for grpo, lora, lora_fp8, qlora, not for full"),
    ({"method": "dpo", "hyperparameters": {"offload_checkpoints": True}}, "runs for grpo, lora, lora_fp8, qlora, not for dpo"),
    ({"method": "kto", "hyperparameters": {"packing": True}}, "preference pairs are never packed"),
])
def test_memory_options_that_cannot_work_are_refused_in_words(spec, words):
    from fastapi.exceptions import RequestValidationError

    from lanner.backend.services.jobs import validate_spec

    with pytest.raises(RequestValidationError) as refused:
        validate_spec({"method": "lora", "model": MODEL, "dataset_id": 1, **spec})
    errors = {tuple(error["loc"][1:]): error["msg"] for error in refused.value.errors()}
    assert words in errors[("hyperparameters",)], errors


def test_a_budget_must_be_positive():
    from fastapi.exceptions import RequestValidationError

    from lanner.backend.services.jobs import validate_spec

    with pytest.raises(RequestValidationError) as refused:
        validate_spec({"method": "lora", "model": MODEL, "dataset_id": 1, "hyperparameters": {"memory_budget_gib": 0}})
    assert [error["loc"][1:] for error in refused.value.errors()] == [("hyperparameters", "memory_budget_gib")]


def test_the_options_reach_the_training_process_and_a_refusal_is_a_422(team):
    chat = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    job = team.alice.post("/api/jobs", json={
        "method": "qlora", "model": MODEL, "dataset_id": chat,
        "hyperparameters": {"memory_budget_gib": 19.5, "offload_checkpoints": True, "packing": True}})
    assert job.status_code == 201, job.text
    options = training_options(JobSpec.model_validate(job.json()["config"]))
    assert (options.memory_budget_gib, options.offload_checkpoints, options.packing) == (19.5, True, True)
    default = training_options(JobSpec.model_validate(team.alice.post("/api/jobs", json={
        "method": "lora", "model": MODEL, "dataset_id": chat}).json()["config"]))
    assert (default.memory_budget_gib, default.offload_checkpoints, default.packing) == (None, False, False)

    refused = team.alice.post("/api/jobs", json={"method": "lora", "model": MODEL, "dataset_id": chat,
                                                 "hyperparameters": {"offload_checkpoints": True, "use_kernels": False}})
    assert refused.status_code == 422
    assert "turn use_kernels on" in refused.json()["detail"][0]["msg"]


def test_the_estimate_spends_the_budget_and_no_more():
    base = {"precision": "bf16", "batch_size": 4, "max_seq_len": 8192, "gradient_checkpointing": True,
            "use_kernels": True}

    def spec(method: str = "lora", **hyperparameters):  # some the API refuses: the estimate ignores them alike
        return unchecked_spec(method, lora={"rank": 16}, **{**base, **hyperparameters})

    def total(**config) -> float:
        return estimate_memory(spec(**config), LLAMA_8B, "cuda")["total_bytes"] / GIB

    def activations(**config) -> float:
        return estimate_memory(spec(**config), LLAMA_8B, "cuda")["activations_bytes"] / GIB

    checkpointed, every_layer = total(), total(gradient_checkpointing=False)
    offloaded = total(offload_checkpoints=True)
    assert offloaded < checkpointed < every_layer
    # A budget between the smallest plan and keeping everything: the step fills it (plus the CUDA
    # context and slack that torch's allocator does not count).
    for budget in (30, 40, 60):
        assert budget < total(memory_budget_gib=budget) <= budget * 1.05 + 0.5
    assert total(memory_budget_gib=40) > checkpointed
    # A budget beyond every layer's activations keeps them all; one below the smallest plan is over budget.
    assert activations(memory_budget_gib=4000) == activations(gradient_checkpointing=False)
    assert total(memory_budget_gib=1) == offloaded
    # The engine runs for adapters on the kernels on a GPU only.
    assert total(memory_budget_gib=40, use_kernels=False) == total(use_kernels=False)
    assert estimate_memory(spec(memory_budget_gib=40), LLAMA_8B, "cpu") == estimate_memory(spec(), LLAMA_8B, "cpu")
    assert total(method="full", memory_budget_gib=40) == total(method="full")
    # GRPO's policy adapter too: its loss and reference passes run through the same decoder layers.
    assert total(method="grpo", memory_budget_gib=40) > total(method="grpo")
