"""Tiny random-init models of each family, as twins: one plain PEFT, one on lanner's kernels, same weights."""
import copy

import torch
import transformers as tf
from peft import PeftModel

from lanner.kernels import get_lora_model

# These models are tiny: one CPU thread is faster than a pool whose threads spin for work, and on a
# shared 2-core box a spinning pool made each training step several times slower.
if not torch.cuda.is_available():
    torch.set_num_threads(1)

TINY = dict(hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=96, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)

# family -> (config class, model class, config overrides); sizes are odd on purpose.
FAMILIES = {
    "llama": (tf.LlamaConfig, tf.LlamaForCausalLM, {}),
    "mistral": (tf.MistralConfig, tf.MistralForCausalLM, dict(sliding_window=4)),
    "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM, {}),
    "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM, dict(head_dim=16)),
    "gemma": (tf.GemmaConfig, tf.GemmaForCausalLM, dict(head_dim=16, hidden_act="gelu_pytorch_tanh")),
    # Gemma 2/3: query scaling by query_pre_attn_scalar (not head_dim), a sliding layer then a global one. Gemma 3's
    # config takes an attention soft-cap that its attention never applies (Gemma 2's does): ours must not either.
    "gemma2": (tf.Gemma2Config, tf.Gemma2ForCausalLM,
               dict(head_dim=16, final_logit_softcapping=3.0, attn_logit_softcapping=5.0, sliding_window=4,
                    query_pre_attn_scalar=24)),
    "gemma3": (tf.Gemma3TextConfig, tf.Gemma3ForCausalLM,
               dict(head_dim=16, sliding_window=4, final_logit_softcapping=3.0, query_pre_attn_scalar=24,
                    attn_logit_softcapping=5.0, layer_types=["sliding_attention", "full_attention"])),
    "phi3": (tf.Phi3Config, tf.Phi3ForCausalLM, {}),
    # Phi-4-mini's partial rotary: 6 of each head's 12 dims rotate
    "phi3_partial": (tf.Phi3Config, tf.Phi3ForCausalLM, dict(partial_rotary_factor=0.5)),
}
# Mixtures of experts (test_moe.py), apart so that the per-family tests of the dense families do not
# run them again: 4 experts, top-2; the load-balancing loss on, so the patched loss must keep it. gpt-oss:
# its expert biases, interleaved gate/up and clamped SwiGLU (a limit the tiny model's values cross), a
# sliding layer then a global one, attention sinks.
MOE_FAMILIES = {
    "qwen3_moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM,
                  dict(head_dim=16, moe_intermediate_size=24, num_experts=4, num_experts_per_tok=2,
                       norm_topk_prob=True, output_router_logits=True)),
    "mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM,
                dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True)),
    "gpt_oss": (tf.GptOssConfig, tf.GptOssForCausalLM,
                dict(head_dim=16, num_local_experts=4, num_experts_per_tok=2, output_router_logits=True,
                     sliding_window=4, layer_types=["sliding_attention", "full_attention"], swiglu_limit=0.15)),
}


def tiny_model(family: str, dtype=torch.float32, device="cpu", seed=0, **overrides):
    config_cls, model_cls, extra = {**FAMILIES, **MOE_FAMILIES}[family]
    torch.manual_seed(seed)
    # eager attention: transformers' reference (its sdpa path drops Gemma 2's attention soft-capping)
    model = model_cls(config_cls(**{**TINY, **extra, **overrides}, attn_implementation="eager"))
    with torch.no_grad():  # norms start at 1 (or 0 for Gemma's 1 + w), gpt-oss's expert biases and sinks at 0:
        for name, param in model.named_parameters():  # perturb them so they matter
            if "norm" in name or "_bias" in name or "sinks" in name:
                param.add_(torch.randn_like(param) * 0.1)
    return model.to(device=device, dtype=dtype)


def randomise_lora(model: PeftModel, seed=1, std=0.05):
    """Nonzero B (PEFT starts it at zero) so the very first step already exercises the whole LoRA path."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def twins(family: str, dtype=torch.float32, device="cpu", gradient_checkpointing=False, **lora_kwargs):
    """(plain PEFT model, kernels model) with identical base and LoRA weights."""
    base = tiny_model(family, dtype, device)
    plain = get_lora_model(copy.deepcopy(base), use_kernels=False, gradient_checkpointing=False, **lora_kwargs)
    fast = get_lora_model(base, use_kernels=True, gradient_checkpointing=gradient_checkpointing, **lora_kwargs)
    randomise_lora(plain)
    randomise_lora(fast)
    return plain, fast


def lora_grads(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def lora_weights(model):
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def max_relative_error(actual: dict, expected: dict) -> float:
    """Worst over tensors of max|a - e| / max|e|."""
    assert actual.keys() == expected.keys() and actual
    return max(((actual[k] - expected[k]).abs().max() / expected[k].abs().max()).item() for k in actual)


def assert_same_moe_step(plain, fast, ids, adapted_experts=True):
    """One step of a mixture-of-experts pair: the loss and its load-balancing part to 1e-5, every LoRA gradient
    (the experts' among them when adapted) to 1e-4."""
    out_plain, out_fast = plain(input_ids=ids, labels=ids), fast(input_ids=ids, labels=ids)
    assert out_plain.aux_loss is not None  # the load-balancing loss is part of both losses
    torch.testing.assert_close(out_fast.aux_loss, out_plain.aux_loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(out_fast.loss, out_plain.loss, rtol=1e-5, atol=0)
    out_plain.loss.backward()
    out_fast.loss.backward()
    grads = lora_grads(fast)
    assert any("experts" in name for name in grads) == adapted_experts
    assert max_relative_error(grads, lora_grads(plain)) < 1e-4


def token_batches(steps, batch, seq, vocab, seed=2, device="cpu"):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab, (batch, seq), generator=generator).to(device) for _ in range(steps)]
