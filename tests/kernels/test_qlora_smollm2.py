"""The real SmolLM2-135M (its first two layers, as in test_smollm2.py) trained in 4-bit for 20 steps,
against HF + PEFT + bitsandbytes over the same NF4 codes (bitsandbytes' own quantisation of the
checkpoint).

Float32 compute, for the interpreter's sake (its bfloat16 is emulated bit by bit in numpy, several
minutes for this model): both sides dequantise to identical float32 weights and differ in summation
order only. Bounds: per-step loss within 1e-4 relative (bf16 noise is ~1e-2), final LoRA weights
within 1e-2 of the largest (measured 2.7e-3: the quantised cut model amplifies AdamW's sign-like
early updates of near-zero gradients more than the dense one in test_smollm2 does).
"""
import torch
from transformers import AutoModelForCausalLM

from lora_twins import lora_weights, max_relative_error, randomise_lora, token_batches
from test_convergence import train
from test_qlora import qlora_twins
from test_smollm2 import first_layers

LAYERS, STEPS, BATCH, SEQ, LR = 2, 20, 1, 4, 2e-3
LOSS_RTOL, WEIGHT_RTOL = 1e-4, 1e-2


def test_smollm2_in_4bit_trains_like_bitsandbytes(smollm2_dir, tmp_path, device):
    base = first_layers(AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).to(device), LAYERS)
    reference, ours = qlora_twins("llama", tmp_path, torch.float32, device, model=base)
    randomise_lora(reference, std=1e-3), randomise_lora(ours, std=1e-3)  # as test_smollm2 (the cut model's loss is ~38)
    batches = token_batches(4, BATCH, SEQ, base.config.vocab_size, device=device) * (STEPS // 4)
    losses_ref, losses_ours = train(reference, batches, LR), train(ours, batches, LR)
    assert losses_ref[-1] < losses_ref[0] - 0.05  # it learns
    for step, (a, b) in enumerate(zip(losses_ours, losses_ref, strict=True)):
        assert abs(a - b) <= LOSS_RTOL * abs(b), f"step {step}: {a} vs {b}"
    assert max_relative_error(lora_weights(ours), lora_weights(reference)) < WEIGHT_RTOL
