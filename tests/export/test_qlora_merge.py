"""A QLoRA adapter is merged into the base its training saw: the checkpoint's linear layers quantised
to NF4 and dequantised once. The merged 16-bit model must equal the 4-bit base with its adapter
(bitsandbytes' own 4-bit model through transformers, as QLoRA training runs it) within bf16 noise,
while the plain merge into the original weights the adapter never saw is far outside it."""
from __future__ import annotations

import re

import pytest
from export_helpers import make_adapter, tiny_model


def four_bit_logits(base_dir, adapter_dir, ids):
    """Logits of the base loaded in 4 bits by transformers + bitsandbytes with the adapter on top,
    unmerged: the model QLoRA training evaluates, loaded as Lanner's QLoRA loads it (the checkpoint's
    dtype, then NF4 with double quantisation),
    run in float32 (the 16-bit parts upcast) so that only the weights differ from the merged model."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from lanner.worker.export.verify import _logits

    config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                bnb_4bit_compute_dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype="auto", quantization_config=config, device_map="cpu")
    assert sum("Linear4bit" in type(m).__name__ for m in base.modules()) == 2 * 7  # every projection is 4-bit
    for param in base.parameters():
        if type(param).__name__ != "Params4bit":
            param.data = param.data.float()
    model = PeftModel.from_pretrained(base, adapter_dir).eval()
    return _logits(model, ids)


def test_qlora_adapter_is_merged_into_the_dequantised_4bit_base(smollm2_dir, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lanner.worker.export import ExportRequest, Quantization, export_merged, run_export
    from lanner.worker.export.verify import _logits, compare_logits, prompt_ids

    base = tiny_model("llama", smollm2_dir, tmp_path / "base")
    adapter = make_adapter(base, tmp_path / "adapter", lora_b_std=0.05)
    nf4 = Quantization()  # Lanner's QLoRA: NF4, blocks of 64, double quantisation, from the checkpoint's dtype

    # The export job of a QLoRA-trained adapter ({}: Lanner's QLoRA settings).
    manifest = run_export(ExportRequest(base_model_dir=base, adapter_dir=adapter, out_dir=tmp_path / "export",
                                        adapter=False, gguf_types=(), base_quantization={}))
    merged_dir = tmp_path / "export" / "merged"
    assert manifest["artifacts"][0]["merged_into"] == {"dequantised_base": nf4.as_dict()}
    check = manifest["verification"]["merged"]
    assert check["passed"] and "4-bit base" in check["check"], check
    assert check["adapter_effect_max_abs_logit_diff"] > 5 * check["bound_max_abs_logit_diff"]

    # Against bitsandbytes' own 4-bit model with the adapter: the same, within the same bound.
    ids = prompt_ids(AutoTokenizer.from_pretrained(merged_dir))
    reference = four_bit_logits(base, adapter, ids)

    def against_4bit(merged_dir):
        merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
        return compare_logits(reference, _logits(merged, ids))

    result = against_4bit(merged_dir)
    print(f"\nmerged vs bitsandbytes 4-bit + adapter: {result}\nbound: {check['bound_max_abs_logit_diff']}")
    assert result["max_abs_logit_diff"] <= check["bound_max_abs_logit_diff"]
    assert result["top1_mismatches"] == result["top1_mismatches_near_ties"]

    # The plain LoRA merge, into the original weights the adapter never saw, is another model.
    export_merged(base, adapter, tmp_path / "merged-plain")
    assert against_4bit(tmp_path / "merged-plain")["max_abs_logit_diff"] > 5 * check["bound_max_abs_logit_diff"]


def test_the_kernels_nf4_and_the_bitsandbytes_fallback_agree_bit_for_bit(monkeypatch):
    import sys

    import torch

    from lanner.worker.export.dequantize import Quantization, round_trip

    # 256 blocks of 64: whole blocks of the double quantisation too (with a partial last one the
    # kernels' absmax codes differ slightly from bitsandbytes', see docs/export.md).
    weight = torch.randn(256, 64, generator=torch.Generator().manual_seed(0)) * 0.3
    for settings in (Quantization(), Quantization(double_quant=False)):
        with_kernels = round_trip(weight, settings, torch.bfloat16)
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, "lanner.kernels.quant", None)  # as if lanner.kernels were not installed
            with_bitsandbytes = round_trip(weight, settings, torch.bfloat16)
        assert with_kernels.dtype == with_bitsandbytes.dtype == torch.float32
        assert torch.equal(with_kernels, with_bitsandbytes)
        assert 0 < (with_kernels - weight).abs().max() < 0.2  # really quantised, and close


@pytest.mark.parametrize("settings, message", [
    ({"quant_type": "int3"}, "quant_type"),
    ({"dtype": "float64"}, "dtype"),
    ({"bits": 4}, "Unknown 4-bit quantisation settings"),
])
def test_bad_quantisation_settings_are_refused_clearly(settings, message):
    from lanner.worker.export import ExportError, Quantization

    with pytest.raises(ExportError, match=message):
        Quantization.from_config(settings)


@pytest.mark.parametrize("target, quantization", [("lm_head", None), ("embed_tokens", None), ("lm_head", {})])
def test_an_adapter_on_one_of_tied_embeddings_merges_into_that_one_only(smollm2_dir, tmp_path, target, quantization):
    """A base that ties lm_head to embed_tokens holds one tensor for both; an adapter on one of them (LoRA there,
    LoRA or QLoRA) changes that one only. PEFT's merge writes the delta into the shared tensor, so into both: the
    export unties them first and saves each one rounded once (and the check passes on its own merit: the floor it
    is measured on is the exact float32 merge)."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from lanner.worker.export import ExportRequest, run_export

    base = tiny_model("llama-tied", smollm2_dir, tmp_path / "base", initializer_range=0.05)
    adapter = make_adapter(base, tmp_path / "adapter", target_modules=("q_proj", target), lora_b_std=0.05)
    manifest = run_export(ExportRequest(base_model_dir=base, adapter_dir=adapter, out_dir=tmp_path / "export",
                                        adapter=False, gguf_types=(), base_quantization=quantization))
    check = manifest["verification"]["merged"]
    assert check["passed"] and check["float32_merge_max_abs_logit_diff"] < 1e-4, check

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), adapter)
    layer = model.base_model.model.get_output_embeddings() if target == "lm_head" else \
        model.base_model.model.get_input_embeddings()
    weight = layer.get_base_layer().weight.detach()  # the shared one, as the checkpoint holds it
    adapted = (weight + layer.get_delta_weight("default")).to(torch.bfloat16)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "export" / "merged", dtype=torch.bfloat16)
    assert merged.config.tie_word_embeddings is False
    changed, kept = ((merged.lm_head, merged.model.embed_tokens) if target == "lm_head"
                     else (merged.model.embed_tokens, merged.lm_head))
    assert torch.equal(changed.weight, adapted) and torch.equal(kept.weight, weight.to(torch.bfloat16))


def test_a_merge_gone_wrong_fails_the_check_that_measures_its_floor_on_it(smollm2_dir, tmp_path, monkeypatch):
    """The check's floor is one cast of its own float32 merge: were that merge wrong (here: the tied embeddings left
    shared, as PEFT merges them), the floor would be the wrong model's and pass it. The float32 merge is itself
    checked against the base with its adapter."""
    from lanner.worker.export import ExportError, ExportRequest, merge, run_export

    base = tiny_model("llama-tied", smollm2_dir, tmp_path / "base", initializer_range=0.05)
    adapter = make_adapter(base, tmp_path / "adapter", target_modules=("q_proj", "lm_head"), lora_b_std=0.05)
    monkeypatch.setattr(merge, "untie_adapted_embeddings_", lambda model: False)
    with pytest.raises(ExportError, match=re.escape("max |logit diff| of the float32 merge")):
        run_export(ExportRequest(base_model_dir=base, adapter_dir=adapter, out_dir=tmp_path / "export",
                                 adapter=False, gguf_types=()))


def test_an_adapter_whose_bias_the_base_has_no_place_for_is_refused_in_words(smollm2_dir, tmp_path):
    from lanner.worker.export import ExportError, ExportRequest, run_export

    base = tiny_model("llama", smollm2_dir, tmp_path / "base", initializer_range=0.05)
    adapter = make_adapter(base, tmp_path / "adapter", target_modules=("q_proj", "o_proj"), lora_bias=True)
    with pytest.raises(ExportError, match=r"lora_bias\) on o_proj, q_proj, which have no bias"):
        run_export(ExportRequest(base_model_dir=base, adapter_dir=adapter, out_dir=tmp_path / "export",
                                 adapter=False, gguf_types=()))
    assert not (tmp_path / "export").exists()
