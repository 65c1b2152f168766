"""The same small model trained with and without the kernels: per-step losses and final LoRA weights.

Random-init mini models from the transformers config classes, float32, AdamW, 20 steps on the same
data. Float32 kernels differ from torch only in summation order (~1e-7 relative per op); over 20
steps of AdamW that stays far below the bounds asserted here.
"""
import pytest
import torch

from lora_twins import lora_weights, max_relative_error, token_batches, twins

STEPS, BATCH, SEQ = 20, 1, 4
LOSS_RTOL = 1e-4
WEIGHT_RTOL = 1e-3


def train(model, batches, lr=1e-2, optimizer=torch.optim.AdamW):
    """Plain loop: forward with labels, backward, an optimizer step; returns the per-step losses."""
    model.train()
    optimizer = optimizer([p for p in model.parameters() if p.requires_grad], lr=lr)
    losses = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def assert_same_training(plain, fast, batches, lr=1e-2, weight_rtol=WEIGHT_RTOL, optimizer=torch.optim.AdamW):
    losses_plain = train(plain, batches, lr, optimizer)
    losses_fast = train(fast, batches, lr, optimizer)
    assert losses_plain[-1] < losses_plain[0] - 0.05  # it learns: the comparison is not between two flat lines
    for step, (ours, reference) in enumerate(zip(losses_fast, losses_plain, strict=True)):
        assert abs(ours - reference) <= LOSS_RTOL * abs(reference), f"step {step}: {ours} vs {reference}"
    assert max_relative_error(lora_weights(fast), lora_weights(plain)) < weight_rtol


# Gemma 2 covers Gemma's (1 + w) norms, GeGLU (tanh), soft-capping and the scaled embedding.
@pytest.mark.parametrize("family, gradient_checkpointing", [("llama", True), ("qwen2", False), ("gemma2", False)])
def test_training_matches_plain_peft(family, gradient_checkpointing, device):
    plain, fast = twins(family, device=device, gradient_checkpointing=gradient_checkpointing)
    # Two batches, seen ten times each: enough repetition that the loss visibly falls.
    batches = token_batches(2, BATCH, SEQ, plain.config.vocab_size, device=device) * (STEPS // 2)
    assert_same_training(plain, fast, batches)
