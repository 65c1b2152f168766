"""Attention blocks: q/k/v and output projections on the LoRA functions, RoPE on the in-place kernel.

Mirrors the families' own attention forward (Llama, Mistral, Qwen2/3, Gemma 1/2/3, Phi-3, gpt-oss). The
attention itself is the model's attention implementation, which patch_model sets to ours ("lanner",
kernels/attention: causal SDPA without a mask, FlexAttention for windows, soft-capping, packed and
padded batches). With a KV cache (generation), or arguments this forward does not expect, the
model's own forward runs (and still calls that implementation).
"""
import sys

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..attention.transformers_glue import ATTENTION_NAME
from ..lora import lora_linear, lora_qkv
from ..memory.layer_run import current_layer_run
from ..ops.rope import apply_rope
from ..peft_projections import first_blocker, lora_projection
from .binding import bind_forward, plain_forward

_ATTENTION_ARGS = ("position_embeddings", "attention_mask", "cache", "past_key_values")


def _modeling_module(attention: nn.Module):
    return sys.modules[type(attention).__module__]


def _project(x, projection_modules, deferred=None):
    """Runs the (one or three) projections on the LoRA kernels, or as PEFT layers when a feature needs that.
    deferred: a dict for q's and k's rank-r terms where the RoPE kernel adds them (lora_qkv), or for o's where
    the residual add does (lora_linear)."""
    if first_blocker(projection_modules) is None:
        projections = [lora_projection(m) for m in projection_modules]
        return (lora_qkv(x, *projections, deferred) if len(projections) == 3
                else (lora_linear(x, projections[0], deferred),))
    return tuple(m(x) for m in projection_modules)


def _rope_takes_terms(attention: nn.Module, position_embeddings, pair_tables: bool) -> bool:
    """Whether q and k go from their projections straight to the RoPE kernel, rotated whole (no per-head norm
    between, no partial rotary), so that it can add their rank-r terms."""
    cos = position_embeddings[0]
    return not hasattr(attention, "q_norm") and not pair_tables and cos.shape[-1] == attention.head_dim


def _rotate(attention: nn.Module, q, k, cos, sin, pair_tables: bool, terms=None):
    if pair_tables:  # gpt-oss: one cos/sin per pair (i, i + D/2), the kernel's tables repeat them
        cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    # Partial rotary (Phi-4-mini's partial_rotary_factor): cos/sin cover the first dims of each head only,
    # which the kernel rotates in place, leaving the rest.
    if cos.shape[-1] <= q.shape[-1] and cos.shape[-1] % 2 == 0:
        return apply_rope(q, k, cos, sin, *((terms or {}).get(name) for name in "qk"))
    return _modeling_module(attention).apply_rotary_pos_emb(q, k, cos, sin)


def _attend(attention: nn.Module, q, k, v, input_shape, position_embeddings, attention_mask, kwargs,
            pair_tables=False, softcapped=False, terms=None):
    """terms: q's and k's rank-r terms that their projections left to the RoPE kernel (_rope_takes_terms)."""
    hidden_shape = (*input_shape, -1, attention.head_dim)
    q, k, v = q.view(hidden_shape), k.view(hidden_shape), v.view(hidden_shape)
    if hasattr(attention, "q_norm"):  # Qwen3, Gemma 3: per-head RMSNorm before RoPE
        q, k = attention.q_norm(q), attention.k_norm(k)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cos, sin = position_embeddings
    q, k = _rotate(attention, q, k, cos, sin, pair_tables, terms)

    config = attention.config
    if hasattr(attention, "sliding_window"):
        kwargs["sliding_window"] = attention.sliding_window
    elif getattr(config, "sliding_window", None) is not None:
        kwargs["sliding_window"] = config.sliding_window
    if softcapped:  # as the family's forward does (Family.attention_softcap)
        kwargs["softcap"] = attention.attn_logit_softcapping
    if getattr(attention, "sinks", None) is not None:
        kwargs["s_aux"] = attention.sinks
    run = current_layer_run()
    if run is not None and run.attention_keep is not None and config._attn_implementation == ATTENTION_NAME:
        kwargs["kept_attention"], kwargs["recomputing"] = run.attention_keep, run.recomputing
    interface = ALL_ATTENTION_FUNCTIONS.get_interface(
        config._attn_implementation, _modeling_module(attention).eager_attention_forward
    )
    out, weights = interface(
        attention, q, k, v, attention_mask,
        dropout=attention.attention_dropout if attention.training else 0.0,
        scaling=attention.scaling,
        **kwargs,
    )
    return out.reshape(*input_shape, -1).contiguous(), weights


def _can_run(args, kwargs) -> bool:
    has_cache = kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None
    return not args and not has_cache and kwargs.get("position_embeddings") is not None


def _split_kwargs(kwargs):
    rest = {key: value for key, value in kwargs.items() if key not in _ATTENTION_ARGS}
    return kwargs["position_embeddings"], kwargs.get("attention_mask"), rest


def _attention_forward(attention: nn.Module, hidden_states, *args, pair_tables=False, softcapped=False,
                       output_terms=None, **kwargs):
    """output_terms: a dict for o's rank-r term where the residual add takes it (patching/layers.py)."""
    if not _can_run(args, kwargs):
        return plain_forward(attention)(hidden_states, *args, **kwargs)
    position_embeddings, attention_mask, rest = _split_kwargs(kwargs)
    terms = {} if _rope_takes_terms(attention, position_embeddings, pair_tables) else None
    q, k, v = _project(hidden_states, (attention.q_proj, attention.k_proj, attention.v_proj), terms)
    out, weights = _attend(attention, q, k, v, hidden_states.shape[:-1], position_embeddings, attention_mask, rest,
                           pair_tables, softcapped, terms)
    (out,) = _project(out, (attention.o_proj,), output_terms)
    return out, weights


def _fused_qkv_attention_forward(attention: nn.Module, hidden_states, *args, output_terms=None, **kwargs):
    """Phi-3: one qkv_proj whose output is split into q, k and v."""
    if not _can_run(args, kwargs):
        return plain_forward(attention)(hidden_states, *args, **kwargs)
    position_embeddings, attention_mask, rest = _split_kwargs(kwargs)
    (qkv,) = _project(hidden_states, (attention.qkv_proj,))
    q_size = attention.config.num_attention_heads * attention.head_dim
    kv_size = attention.num_key_value_heads * attention.head_dim
    # RoPE rotates q and k in place; copies keep v's storage (a view of qkv) unmodified for autograd (always
    # copies: for a single token, .contiguous() would return the slice itself, size-1 dims having any stride).
    q, k = (qkv[..., part].clone(memory_format=torch.contiguous_format)
            for part in (slice(0, q_size), slice(q_size, q_size + kv_size)))
    v = qkv[..., q_size + kv_size:]
    out, weights = _attend(attention, q, k, v, hidden_states.shape[:-1], position_embeddings, attention_mask, rest)
    (out,) = _project(out, (attention.o_proj,), output_terms)
    return out, weights


def patch_attention(attention: nn.Module, pair_tables: bool = False, softcapped: bool = False) -> str | None:
    """Patches a family attention module; returns why not, in words, when it cannot. pair_tables: the
    family's RoPE tables are gpt-oss's (Family.rope_pair_tables); softcapped: its attention soft-caps the scores
    by the module's attn_logit_softcapping (Family.attention_softcap)."""
    if all(hasattr(attention, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj")):
        bind_forward(attention, _attention_forward, pair_tables=pair_tables, softcapped=softcapped)
        return None
    if hasattr(attention, "qkv_proj") and hasattr(attention, "o_proj"):
        bind_forward(attention, _fused_qkv_attention_forward)
        return None
    return f"{type(attention).__name__} has neither q/k/v/o nor qkv/o projections"
