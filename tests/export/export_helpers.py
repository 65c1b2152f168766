"""Helpers for the export tests (fixtures are in conftest.py)."""
from __future__ import annotations

from pathlib import Path

BASE_MODEL_NAME = "builtin/SmolLM2-135M-Instruct"


def make_adapter(base_dir: Path, out_dir: Path, *, lora_b_std: float = 0.03, seed: int = 0) -> Path:
    """Plain PEFT LoRA (r=8) on q/k/v/o and the MLP, its B matrices set to small random values so it
    is not a no-op (a fresh LoRA has B = 0). Training steps would do the same, but cost minutes on
    this shared 2-core box. Saved the way the trainer saves an adapter (with the tokenizer)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)  # lora_A's initialisation
    generator = torch.Generator().manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, task_type="CAUSAL_LM",
                        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * lora_b_std)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
