"""The GGUF converter on tiny random-init models of each supported architecture, saved with
save_pretrained: llama.cpp must compute the same next-token distribution as transformers. The
weights are made large enough (and norms/biases non-trivial) that a wrong mapping, a missing bias or
a wrong q/k permutation shows up as a different distribution."""
from __future__ import annotations

import numpy as np
import pytest
from export_helpers import tiny_model

PROMPT = "The lanner falcon hunts small birds over open country."


def compare(model_dir, gguf_path):
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
    return compare_logits([reference], [got])


@pytest.mark.parametrize("kind", ["llama", "llama3-rope", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3",
                                  "qwen3_moe", "mixtral"])
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
