"""The GGUF converter on tiny random-init models of each supported architecture, saved with
save_pretrained: llama.cpp must compute the same next-token distribution as transformers. The
weights are made large enough (and norms/biases non-trivial) that a wrong mapping, a missing bias or
a wrong q/k permutation shows up as a different distribution."""
from __future__ import annotations

import numpy as np
import pytest
from export_helpers import tiny_model

PROMPT = "The lanner falcon hunts small birds over open country."


def compare(model_dir, gguf_path, positions: int | None = None):
    import torch
    from lanner.inference.generation import open_llama
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lanner.worker.export.verify import compare_logits

    ids = AutoTokenizer.from_pretrained(model_dir)(PROMPT)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = model(torch.tensor([ids])).logits[0].numpy()
    llm = open_llama(str(gguf_path), logits_all=True, n_ctx=64)
    try:
        llm.eval(ids)
        got = np.array(llm.scores[: len(ids)], dtype=np.float32)
    finally:
        llm.close()
    return compare_logits([reference[:positions]], [got[:positions]])


@pytest.mark.parametrize("kind", ["llama", "llama3-rope", "llama-yarn", "mistral", "qwen2", "qwen3", "gemma", "gemma2",
                                  "gemma3", "gemma3-global", "qwen3_moe", "mixtral", "gpt_oss-tied"])
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


def test_a_sliding_window_llama_cpp_does_not_apply_caps_the_context(smollm2_dir, tmp_path):
    """llama.cpp runs Mistral as LLAMA, without its sliding window: the GGUF says its context is the window, within
    which attending to everything is the same."""
    from gguf import GGUFReader

    from lanner.worker.export import convert_to_gguf
    from lanner.worker.export.verify import F16_KL_BOUND

    model_dir = tiny_model("mistral-window", smollm2_dir, tmp_path / "mistral")
    convert_to_gguf(model_dir, tmp_path / "mistral.gguf", out_type="f16")
    field = GGUFReader(str(tmp_path / "mistral.gguf")).fields["llama.context_length"]
    assert int(field.parts[field.data[0]][0]) == 6
    result = compare(model_dir, tmp_path / "mistral.gguf", positions=6)
    assert result["top1_mismatches"] == result["top1_mismatches_near_ties"] and result["mean_kl"] < F16_KL_BOUND


BASE = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 256, "tie_word_embeddings": True}
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 512}


@pytest.mark.parametrize("config, words", [
    ({"model_type": "llama", "hidden_act": "gelu"}, "activation is 'gelu'"),
    ({"model_type": "qwen2", "head_dim": 32}, "hidden x hidden"),
    ({"model_type": "gemma", "tie_word_embeddings": False}, "not tied"),
    ({"model_type": "gemma2", "sliding_window": 8, "layer_types": ["full_attention"] * 2}, "at least one"),
    ({"model_type": "qwen3", "rope_parameters": {**YARN, "beta_fast": 8.0}}, "YaRN RoPE ramp"),
    ({"model_type": "gpt_oss", "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
      "rope_parameters": {**YARN, "beta_fast": 8.0, "truncate": False}}, "YaRN RoPE ramp"),
    ({"model_type": "gemma3_text", "rope_parameters": {"full_attention": {**YARN, "attention_factor": 1.0},
                                                       "sliding_attention": {"rope_type": "default"}}},
     "attention factor"),
    ({"model_type": "llama", "partial_rotary_factor": 0.5}, "partial_rotary_factor"),
])
def test_what_llama_cpp_computes_differently_is_refused_in_words(config, words):
    from lanner.worker.export import ExportError
    from lanner.worker.export.gguf_arch import arch_for

    with pytest.raises(ExportError, match=words):
        arch_for({**BASE, **config})


def test_a_bias_llama_cpp_has_no_place_for_is_refused_before_writing(tmp_path):
    """Qwen3 with attention_bias: llama.cpp's qwen3 graph has no q/k/v biases and would refuse the whole file."""
    import json

    import torch
    from safetensors.torch import save_file

    from lanner.worker.export import ExportError, convert_to_gguf

    (tmp_path / "config.json").write_text(json.dumps({**BASE, "model_type": "qwen3", "attention_bias": True}))
    save_file({"model.layers.0.self_attn.q_proj.weight": torch.zeros(64, 64),
               "model.layers.0.self_attn.q_proj.bias": torch.zeros(64)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ExportError, match="bias on model.layers.0.self_attn.q_proj"):
        convert_to_gguf(tmp_path, tmp_path / "out.gguf")
    assert not (tmp_path / "out.gguf").exists()
