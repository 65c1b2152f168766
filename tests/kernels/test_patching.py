"""get_lora_model / patch_model on every supported family: same loss and gradients as plain PEFT,
per-instance patching, and the fallbacks."""
import copy
import logging

import pytest
import torch
import transformers as tf
from peft import PeftModel
from transformers.models.llama import modeling_llama

from lanner.kernels import get_lora_model, patch_model, unpatch_model
from lanner.kernels.patching.binding import is_patched
from lora_twins import FAMILIES, lora_grads, max_relative_error, randomise_lora, tiny_model, token_batches, twins

# float32 throughout: the kernels round differently from torch only at float32 precision.
LOSS_RTOL, GRAD_RTOL = 1e-5, 1e-4


def _patched_modules(model):
    return [name for name, module in model.named_modules() if is_patched(module)]


def _kernel_records(caplog):
    return [r for r in caplog.records if r.name == "lanner.kernels" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_one_training_step_matches_plain_peft(family, device):
    """Loss and every LoRA gradient, with gradient checkpointing on the kernels side (recompute path)."""
    plain, fast = twins(family, device=device, gradient_checkpointing=True)
    plain.train(), fast.train()
    (ids,) = token_batches(1, 1, 5, plain.config.vocab_size, device=device)

    loss_plain = plain(input_ids=ids, labels=ids).loss
    loss_plain.backward()
    out = fast(input_ids=ids, labels=ids)
    out.loss.backward()

    assert out.logits is None  # the fused head never built them
    torch.testing.assert_close(out.loss, loss_plain, rtol=LOSS_RTOL, atol=0)
    assert max_relative_error(lora_grads(fast), lora_grads(plain)) < GRAD_RTOL
    # the decoder layers of Llama's layout run patching/layers.py's forward (Gemma 2/3, Phi-3 and MoE their own)
    layers = fast.get_base_model().model.layers
    llama_layout = family in ("llama", "mistral", "qwen2", "qwen3", "gemma")
    assert all(is_patched(layer) == llama_layout for layer in layers)


def test_training_without_checkpointing_runs_attention_on_the_kernels(device, monkeypatch):
    """config.use_cache stays on without gradient checkpointing; a cache built in training would send attention
    through transformers' own forward."""
    from lanner.kernels.patching import attention

    plain, fast = twins("llama", device=device)
    assert fast.config.use_cache
    original, projected = attention._project, []

    def counted(*args):
        projected.append(args)
        return original(*args)

    monkeypatch.setattr(attention, "_project", counted)
    (ids,) = token_batches(1, 1, 5, plain.config.vocab_size, device=device)
    fast.train()
    fast(input_ids=ids, labels=ids).loss.backward()
    assert projected


def test_a_single_token_trains_like_plain_peft(device):
    """One token: size-1 dims make a slice of Phi-3's fused qkv "contiguous" already, and RoPE rotated it in place
    inside the projection's output (autograd refused it)."""
    plain, fast = twins("phi3", device=device)
    ids = token_batches(1, 1, 1, plain.config.vocab_size, device=device)[0]
    for model in (plain, fast):
        model.train()
        model(input_ids=ids, use_cache=False).logits.float().square().sum().backward()
    assert max_relative_error(lora_grads(fast), lora_grads(plain)) < GRAD_RTOL


def test_padding_mask_and_num_items_in_batch(device):
    """A padded batch, and the Trainer's num_items_in_batch normalisation under gradient accumulation."""
    plain, fast = twins("llama", device=device)
    # The last pad position sees no real key and predicts the first real token: transformers' sdpa, like our
    # attention, gives such a row zeros (its eager gives it uniform weights), so sdpa is the reference.
    plain.get_base_model().set_attn_implementation("sdpa")
    ids = torch.randint(3, 96, (2, 4), device=device)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # left padding
    labels = ids.masked_fill(mask == 0, -100)
    num_items = torch.tensor(9, device=device)
    losses = []
    for model in (plain, fast):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels, num_items_in_batch=num_items).loss
        loss.backward()
        losses.append(loss)
    # sum over the 4 + 1 valid shifted labels, divided by 9 (not by their count)
    torch.testing.assert_close(losses[1], losses[0], rtol=LOSS_RTOL, atol=0)
    assert max_relative_error(lora_grads(fast), lora_grads(plain)) < GRAD_RTOL


def test_logits_without_labels_and_generation_match(device):
    plain, fast = twins("llama", device=device)
    plain.eval(), fast.eval()
    ids = torch.randint(3, 96, (1, 5), device=device)
    with torch.no_grad():
        torch.testing.assert_close(fast(input_ids=ids).logits, plain(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
        # With a KV cache the attention runs transformers' own forward; the rest stays on the kernels.
        generated_plain = plain.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
        generated_fast = fast.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(generated_fast, generated_plain)


def test_patching_is_per_instance(device):
    class_forwards = (modeling_llama.LlamaMLP.forward, modeling_llama.LlamaAttention.forward,
                      modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaForCausalLM.forward)
    fast = get_lora_model(tiny_model("llama", device=device), gradient_checkpointing=False)
    bystander = tiny_model("llama", device=device)

    # the layers (patching/layers.py), attention + mlp, norms, final norm, head
    assert len(_patched_modules(fast)) == 2 + 2 * 2 + 2 * 2 + 1 + 1
    assert _patched_modules(bystander) == []
    assert (modeling_llama.LlamaMLP.forward, modeling_llama.LlamaAttention.forward,
            modeling_llama.LlamaRMSNorm.forward, modeling_llama.LlamaForCausalLM.forward) == class_forwards

    unpatch_model(fast)
    assert _patched_modules(fast) == []


def test_unsupported_architecture_falls_back_with_one_log_line(caplog, device):
    config = tf.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64, n_positions=32)
    with caplog.at_level(logging.INFO, logger="lanner.kernels"):
        model = get_lora_model(tf.GPT2LMHeadModel(config).to(device), target_modules=["c_attn"])
    records = _kernel_records(caplog)
    assert len(records) == 1
    assert "no kernels for model type 'gpt2'" in records[0].getMessage()
    assert "plain PEFT" in records[0].getMessage()
    assert isinstance(model, PeftModel) and _patched_modules(model) == []
    ids = torch.randint(0, 64, (1, 4), device=device)
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)


def test_an_mlp_activation_without_a_kernel_is_said_and_trains_like_plain_peft(caplog, device):
    base = tiny_model("llama", device=device, hidden_act="relu")
    plain = get_lora_model(copy.deepcopy(base), use_kernels=False)
    with caplog.at_level(logging.WARNING, logger="lanner.kernels"):
        fast = get_lora_model(base, use_kernels=True)
    assert any("MLP runs on transformers' forward (no GLU kernel for its activation ReLU" in r.getMessage()
               for r in _kernel_records(caplog))
    randomise_lora(plain), randomise_lora(fast)
    (ids,) = token_batches(1, 1, 5, plain.config.vocab_size, device=device)
    losses = [model(input_ids=ids, labels=ids).loss for model in (plain, fast)]
    torch.testing.assert_close(losses[1], losses[0], rtol=LOSS_RTOL, atol=0)


@pytest.mark.parametrize("checkpointing", [False, True], ids=["plain", "checkpointed"])
def test_lora_dropout_runs_peft_projections_with_a_log_line(checkpointing, caplog, device):
    with caplog.at_level(logging.INFO, logger="lanner.kernels"):
        plain, fast = twins("llama", device=device, lora_dropout=0.1, gradient_checkpointing=checkpointing)
    records = _kernel_records(caplog)
    assert len(records) == 1 and "lora_dropout > 0" in records[0].getMessage()
    # Training: both draw the same dropout masks from the same seed, through PEFT's projections; checkpointed, the
    # memory engine's measuring forward at the first step (and the recompute) leave the random state as it was.
    ids = torch.randint(3, 96, (2, 5), device=device)
    losses = []
    for model in (plain, fast):
        model.train()
        torch.manual_seed(3)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=LOSS_RTOL, atol=0)
    assert max_relative_error(lora_grads(fast), lora_grads(plain)) < GRAD_RTOL


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_cpu_without_triton_interpreter_falls_back(caplog, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET")
    with caplog.at_level(logging.INFO, logger="lanner.kernels"):
        report = patch_model(tiny_model("llama"))
    assert not report.active and "need a CUDA device" in report.fallback_reason
    assert len(_kernel_records(caplog)) == 1


def test_disabled_adapter_runs_the_base_model(device):
    """PEFT's disable_adapter() context (used for reference-model passes) gives the base model's logits."""
    plain, fast = twins("qwen2", device=device)
    plain.eval(), fast.eval()
    ids = torch.randint(3, 96, (1, 6), device=device)
    with torch.no_grad():
        with plain.disable_adapter():
            base_logits = plain(input_ids=ids).logits
        with fast.disable_adapter():
            disabled = fast(input_ids=ids).logits
        adapted = fast(input_ids=ids).logits
    torch.testing.assert_close(disabled, base_logits, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(adapted, base_logits, atol=1e-3)
