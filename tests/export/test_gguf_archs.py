"""The GGUF converter on tiny random-init models of each supported architecture, saved with
save_pretrained: llama.cpp must compute the same next-token distribution as transformers. The
weights are made large enough (and norms/biases non-trivial) that a wrong mapping, a missing bias or
a wrong q/k permutation shows up as a different distribution."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

PROMPT = "The lanner falcon hunts small birds over open country."


def tiny_model(kind: str, smollm2_dir, out_dir):
    import torch
    import transformers

    common = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  tie_word_embeddings=False, initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    configs = {
        "llama": lambda: transformers.LlamaConfig(**common),
        # Llama 3.1+ RoPE scaling; a short original context so the scaling changes short prompts too.
        "llama3-rope": lambda: transformers.LlamaConfig(**common, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8}),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=None),
        "qwen2": lambda: transformers.Qwen2Config(**common),
        "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=32),
        "gemma": lambda: transformers.GemmaConfig(**{**common, "tie_word_embeddings": True}, head_dim=16),
    }
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(configs[kind]())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1 + 0.2 * torch.randn_like(param))
            elif name.endswith(".bias"):
                param.copy_(0.3 * torch.randn_like(param))
    model.to(torch.float16).save_pretrained(out_dir)  # f16 weights: the f16 GGUF holds them exactly
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy2(smollm2_dir / name, out_dir / name)
    return out_dir


def compare(model_dir, gguf_path):
    import torch
    from llama_cpp import Llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lanner.worker.export.verify import compare_logits

    ids = AutoTokenizer.from_pretrained(model_dir)(PROMPT)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].numpy()
    llm = Llama(model_path=str(gguf_path), logits_all=True, n_ctx=64, verbose=False)
    try:
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()
    return compare_logits([reference], [got])


@pytest.mark.parametrize("kind", ["llama", "llama3-rope", "mistral", "qwen2", "qwen3", "gemma"])
def test_tiny_model_converts_and_matches_in_llama_cpp(kind, smollm2_dir, tmp_path):
    from lanner.worker.export import convert_to_gguf
    from lanner.worker.export.verify import F16_KL_BOUND

    model_dir = tiny_model(kind, smollm2_dir, tmp_path / kind)
    info = convert_to_gguf(model_dir, tmp_path / f"{kind}.gguf", out_type="f16")
    result = compare(model_dir, tmp_path / f"{kind}.gguf")
    print(f"\n{kind} -> {info['architecture']}: {result}")
    assert result["top1_mismatches"] == result["top1_mismatches_near_ties"]
    assert result["mean_kl"] < F16_KL_BOUND


def test_without_the_qk_permutation_llama_goes_wrong(smollm2_dir, tmp_path, monkeypatch):
    """The classic bug, kept as a negative control: skip the q/k permutation and llama.cpp's rope
    rotates the wrong pairs."""
    from lanner.worker.export import convert_to_gguf, gguf_arch
    from lanner.worker.export.verify import F16_KL_BOUND

    model_dir = tiny_model("llama", smollm2_dir, tmp_path / "llama")
    broken = gguf_arch.ArchSpec(gguf_arch.ARCHITECTURES["llama"].arch, permute_qk=False)
    monkeypatch.setitem(gguf_arch.ARCHITECTURES, "llama", broken)
    convert_to_gguf(model_dir, tmp_path / "broken.gguf", out_type="f16")
    assert compare(model_dir, tmp_path / "broken.gguf")["mean_kl"] > 10 * F16_KL_BOUND


def test_llama3_rope_scaling_is_written_and_needed(smollm2_dir, tmp_path):
    """The rope_freqs tensor carries Llama 3's RoPE scaling; the same model read as unscaled differs."""
    import json

    from lanner.worker.export import convert_to_gguf
    from lanner.worker.export.verify import F16_KL_BOUND

    model_dir = tiny_model("llama3-rope", smollm2_dir, tmp_path / "scaled")
    convert_to_gguf(model_dir, tmp_path / "scaled.gguf", out_type="f16")
    assert compare(model_dir, tmp_path / "scaled.gguf")["mean_kl"] < F16_KL_BOUND
    config = json.loads((model_dir / "config.json").read_text())
    config.pop("rope_scaling", None)
    config["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    (model_dir / "config.json").write_text(json.dumps(config))
    convert_to_gguf(model_dir, tmp_path / "unscaled.gguf", out_type="f16")
    tiny_model("llama3-rope", smollm2_dir, tmp_path / "scaled")  # the reference: scaled again
    assert compare(model_dir, tmp_path / "unscaled.gguf")["mean_kl"] > 10 * F16_KL_BOUND
