"""QLoRA on a mixture of experts: the stacked expert weights stored in NF4 (quant/nf4_experts.py) and trained on
the grouped kernels, against plain PEFT over the same weights dequantised (bitsandbytes quantises nn.Linear
layers only: it has no 3-D expert format to compare with). Both sides then hold the same dense values, so in
float32 they differ by summation order only."""
import copy
import logging

import pytest
import torch
import transformers as tf

from lanner.kernels import dequantize_model, get_lora_model, layers_unpatched
from lanner.kernels.quant import quantize_model, save_4bit
from lanner.kernels.quant.nf4_experts import dense_experts_, is_nf4_stacked
from lora_twins import assert_same_moe_step, randomise_lora, tiny_model, token_batches
from test_convergence import assert_same_training

EXPERTS = ("gate_up_proj", "down_proj")


def nf4_twins(family, device, gradient_checkpointing=False, **lora_kwargs):
    """(plain PEFT over the dequantised base, ours over NF4 experts and NF4 linears), same LoRA init."""
    quantised = quantize_model(tiny_model(family, device=device), quant_type="nf4")
    reference = dequantize_model(copy.deepcopy(quantised))
    plain = get_lora_model(reference, use_kernels=False, gradient_checkpointing=False, **lora_kwargs)
    ours = get_lora_model(quantised, gradient_checkpointing=gradient_checkpointing, **lora_kwargs)
    randomise_lora(plain)
    randomise_lora(ours)
    return plain, ours


def bare_experts(model):
    return [layer.mlp.experts.get_base_layer() if hasattr(layer.mlp.experts, "get_base_layer") else layer.mlp.experts
            for layer in model.get_base_model().model.layers]


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "gpt_oss"])
def test_nf4_experts_step_like_peft_on_the_dequantised_base(family, caplog, device):
    with caplog.at_level(logging.INFO, logger="lanner.kernels"):
        plain, ours = nf4_twins(family, device)
    assert "'moe_experts': 2" in caplog.text
    for experts, dense in zip(bare_experts(ours), bare_experts(plain), strict=True):
        for name in EXPERTS:
            assert is_nf4_stacked(experts, name) and not is_nf4_stacked(dense, name)
            stored = experts.parametrizations[name].original
            assert stored.dtype == torch.uint8 and stored.numel() == getattr(dense, name).numel() // 2
    assert not [name for name, p in ours.named_parameters() if p.dim() == 3]  # nothing left in 16/32 bits
    # The same adapter layout (PEFT nests its wrappers by name over NF4 experts): an adapter trained on them
    # loads onto the 16-bit base.
    shapes = lambda model: {k: v.shape for k, v in model.state_dict().items() if "lora_" in k}  # noqa: E731
    assert shapes(ours) == shapes(plain)

    ids = token_batches(1, 2, 8, plain.config.vocab_size, device=device)[0]
    assert_same_moe_step(plain, ours, ids)

    # The base alone (a preference method's reference): transformers' forward over the dequantised copy.
    with ours.disable_adapter(), plain.disable_adapter(), torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
    # Decoding (GRPO's generation) on the layers' own forwards: the NF4 experts stay on the kernels.
    with layers_unpatched(ours), torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_a_few_tokens_read_only_their_experts(device):
    """Decoding a token or two routes to fewer experts than there are: only theirs are dequantised into the shared
    buffer (the rest of it, poisoned here, is never read), and the logits are the full read's."""
    from lanner.kernels.quant.quantised_linear import release_buffers, shared_buffer

    plain, ours = nf4_twins("qwen3_moe", device)
    ours.eval(), plain.eval()
    ids = token_batches(1, 1, 1, plain.config.vocab_size, device=device)[0]  # 1 token x top-2 < 4 experts
    release_buffers()
    experts = bare_experts(ours)[0]
    for name in EXPERTS:
        shared_buffer(getattr(experts, name).numel(), device, torch.float32, f"experts.{name}").fill_(float("nan"))
    with torch.no_grad():
        logits = ours(input_ids=ids).logits
        buffer = shared_buffer(experts.gate_up_proj.numel(), device, torch.float32, "experts.gate_up_proj")
        assert buffer.isnan().any()  # the experts no token went to were not read
        torch.testing.assert_close(logits, plain(input_ids=ids).logits, rtol=1e-5, atol=1e-5)


def test_nf4_experts_train_like_peft_under_the_memory_engine(device):
    plain, ours = nf4_twins("qwen3_moe", device, gradient_checkpointing=True)
    batches = token_batches(1, 1, 6, plain.config.vocab_size, device=device) * 3
    # SGD: the weights then differ by lr times the gradients' differences, which is what is compared. AdamW
    # moves an element by ~lr whatever its gradient's size, so elements whose gradient is near zero took the
    # GPU's summation order to 4% of the largest weight.
    assert_same_training(plain, ours, batches, lr=0.3, weight_rtol=1e-4, optimizer=torch.optim.SGD)


def test_frozen_nf4_experts_run_on_the_grouped_kernels(caplog, device):
    """LoRA on attention only: the NF4 experts are not adapted, and still run (frozen) on the kernels, which
    read them dequantised per call instead of keeping a dense copy for backward."""
    with caplog.at_level(logging.INFO, logger="lanner.kernels"):
        plain, ours = nf4_twins("mixtral", device, target_modules=["q_proj", "v_proj"])
    assert "'moe_experts': 2" in caplog.text
    assert_same_moe_step(plain, ours, token_batches(1, 1, 8, plain.config.vocab_size, device=device)[0],
                         adapted_experts=False)


def test_what_cannot_read_nf4_experts_says_so(tmp_path, device):
    """PEFT's own forward on NF4 experts (kernels off), merging into them, saving them in bitsandbytes' format:
    each an error in words. dequantize_model gives them back dense, after which the adapter merges."""
    quantised = quantize_model(tiny_model("qwen3_moe", device=device), quant_type="nf4")
    quantize_model(quantised, quant_type="nf4")  # a second call leaves what is stored as it is
    assert len(quantised.model.layers[0].mlp.experts.parametrizations.gate_up_proj) == 1
    ids = token_batches(1, 1, 8, quantised.config.vocab_size, device=device)[0]
    plain = get_lora_model(copy.deepcopy(quantised), use_kernels=False, gradient_checkpointing=False)
    with pytest.raises(RuntimeError, match="stored in NF4, which PEFT's own LoRA forward cannot adapt"):
        plain(input_ids=ids)
    # A job with the kernels off puts them back in 16 bits first (the linear layers stay in NF4).
    fresh = get_lora_model(copy.deepcopy(quantised), use_kernels=False, gradient_checkpointing=False)
    assert dense_experts_(fresh) == 2 and not any(is_nf4_stacked(e, "down_proj") for e in bare_experts(fresh))
    fresh(input_ids=ids, labels=ids).loss.backward()
    with pytest.raises(ValueError, match="bitsandbytes has no format for stacked expert weights"):
        save_4bit(quantised, tmp_path / "4bit")

    ours = get_lora_model(quantised, gradient_checkpointing=False)
    randomise_lora(ours)
    ours.eval()
    with torch.no_grad():
        expected = ours(input_ids=ids).logits
    experts = ours.get_base_model().model.layers[0].mlp.experts
    experts.merge()  # PEFT's merge adds the delta to a dequantised copy: the adapter would be lost
    with pytest.raises(RuntimeError, match="cannot merge into Qwen3MoeExperts's NF4-stored weights"):
        ours(input_ids=ids)
    experts.merged_adapters.clear()

    dequantize_model(ours)
    assert not any(is_nf4_stacked(e, name) for e in bare_experts(ours) for name in EXPERTS)
    merged = ours.merge_and_unload()
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)


def test_experts_without_grouped_kernels_stay_in_16_bits_in_words(caplog):
    """A mixture of experts the grouped kernels do not run (Qwen2-MoE: no kernels for its family) keeps its
    stacked experts dense under NF4, as FP8 keeps every family's, and says why."""
    torch.manual_seed(0)
    qwen2_moe = tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
        hidden_size=32, intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=16,
        num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, num_experts=4, num_experts_per_tok=2,
        vocab_size=64)).bfloat16()
    cases = [(qwen2_moe, "nf4", "NF4 experts train on the grouped kernels only, and no kernels for mixtures of "
                                "experts of model type 'qwen2_moe'"),
             (tiny_model("qwen3_moe", dtype=torch.bfloat16), "fp8", "FP8 quantises linear layers only")]
    for model, quant_type, words in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lanner.kernels"):
            quantize_model(model, quant_type=quant_type)
        experts = model.model.layers[0].mlp.experts
        assert experts.gate_up_proj.dtype == experts.down_proj.dtype == torch.bfloat16
        assert not is_nf4_stacked(experts, "gate_up_proj")
        assert "stacked expert weights" in caplog.text and words in caplog.text


def test_nf4_experts_need_a_device_the_grouped_kernels_run_on(monkeypatch, caplog):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the CPU as a studio without a GPU runs it: no kernels
    with caplog.at_level(logging.WARNING, logger="lanner.kernels"):
        model = quantize_model(tiny_model("qwen3_moe"), quant_type="nf4")
    assert not is_nf4_stacked(model.model.layers[0].mlp.experts, "gate_up_proj")
    assert "need a CUDA device or TRITON_INTERPRET=1 (the model is on cpu)" in caplog.text
