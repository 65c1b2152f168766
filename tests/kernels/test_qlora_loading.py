"""Loading in 4-bit: quantise on load, bitsandbytes 4-bit checkpoints as stored, and ours saved for bitsandbytes."""
import json

import bitsandbytes.functional as bnbf
import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, BitsAndBytesConfig

from lanner.kernels import get_lora_model, load_4bit, save_4bit
from lanner.kernels.quant import NF4Linear, quantize_model
from lora_twins import tiny_model, token_batches
from test_qlora import BNB_CPU_SIZES, bnb_4bit, nf4_layers


def _logits(model, ids):
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def test_a_16_bit_checkpoint_is_quantised_on_load(tmp_path, device):
    tiny_model("qwen2", torch.bfloat16, **BNB_CPU_SIZES).save_pretrained(tmp_path)
    model = get_lora_model(tmp_path, load_in_4bit=True, gradient_checkpointing=False)
    base = model.get_base_model()
    assert len(nf4_layers(model)) == 7 * 2
    assert all(layer.nf4.nested and layer.nf4.blocksize == 64 for layer in nf4_layers(model).values())
    assert type(base.lm_head) is nn.Linear and type(base.model.embed_tokens) is nn.Embedding  # left dense
    assert base.model.layers[0].self_attn.q_proj.base_layer.bias.dtype == torch.bfloat16  # Qwen2 bias stays dense
    assert next(base.parameters()).device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_a_bitsandbytes_checkpoint_loads_as_stored(tmp_path, device):
    bnb = bnb_4bit(tiny_model("llama", **BNB_CPU_SIZES), tmp_path / "float", device=device)
    bnb.save_pretrained(tmp_path / "bnb")
    assert json.loads((tmp_path / "bnb" / "config.json").read_text())["quantization_config"]["load_in_4bit"]

    ours = load_4bit(tmp_path / "bnb", device=device)
    assert len(nf4_layers(ours)) == 7 * 2
    for name, layer in nf4_layers(ours).items():
        theirs = bnb.get_submodule(name)
        assert torch.equal(layer.weight, theirs.weight.data), name  # the saved codes, not re-quantised
    ids = token_batches(1, 2, 6, ours.config.vocab_size, device=device)[0]
    torch.testing.assert_close(_logits(ours, ids), _logits(bnb, ids), rtol=1e-5, atol=1e-5)


def test_ours_saved_loads_in_transformers_and_bitsandbytes(tmp_path, device):
    tiny_model("llama", **BNB_CPU_SIZES).save_pretrained(tmp_path / "float")  # loaded in bf16 as a user's model would be
    ours = quantize_model(AutoModelForCausalLM.from_pretrained(tmp_path / "float", dtype=torch.bfloat16), device)
    save_4bit(ours, tmp_path / "4bit")
    assert not hasattr(ours.config, "quantization_config")  # the marks are for the saved copy only
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path / "4bit", device_map={"": device})
    assert type(theirs.model.layers[0].mlp.up_proj).__name__ == "Linear4bit"
    for name, layer in nf4_layers(ours).items():
        weight = theirs.get_submodule(name).weight
        assert torch.equal(layer.weight, weight.data), name
        assert torch.equal(layer.dense_weight(), bnbf.dequantize_4bit(weight.data, weight.quant_state)), name
    ids = token_batches(1, 2, 6, ours.config.vocab_size, device=device)[0]
    expected = _logits(ours, ids)
    # Same weights; bitsandbytes' bf16 matmul path rounds differently here and there (a bf16 ulp).
    torch.testing.assert_close(_logits(theirs, ids), expected, rtol=0, atol=1e-2 * expected.abs().max().item())
    again = load_4bit(tmp_path / "4bit", device=device)  # and back, exactly
    torch.testing.assert_close(_logits(again, ids), expected, rtol=0, atol=0)


def test_a_bitsandbytes_model_in_memory_converts_to_ours(tmp_path, device):
    bnb = bnb_4bit(tiny_model("llama", **BNB_CPU_SIZES), tmp_path, device=device)
    ids = token_batches(1, 2, 6, bnb.config.vocab_size, device=device)[0]
    expected = _logits(bnb, ids)
    ours = quantize_model(bnb)
    assert len(nf4_layers(ours)) == 7 * 2 and isinstance(ours.model.layers[0].mlp.up_proj, NF4Linear)
    torch.testing.assert_close(_logits(ours, ids), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("config, message", [
    (BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="fp4"), "only NF4"),
    (BitsAndBytesConfig(load_in_8bit=True), "only bitsandbytes 4-bit"),
])
def test_other_quantisations_are_refused_clearly(config, message, tmp_path):
    model = tiny_model("llama", **BNB_CPU_SIZES)
    model.config.quantization_config = config.to_dict()
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=message):
        get_lora_model(tmp_path, load_in_4bit=True)
