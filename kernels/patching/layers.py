"""Decoder layers of Llama's layout on our own forward: the residual stream without passes of its own.

- In backward the norms add the residual stream's gradient into theirs (rms_norm's pass_input): two adds of
  (tokens x hidden) a layer fewer than autograd's sums after them.
- In a recompute whose MLP skips its output, the last residual add is not made (ops.residual.unread_sum).
- Over an FP8 base the o and down projections' GEMMs cannot accumulate their LoRA terms onto their outputs
  (quant/fp8.py): the residual adds take those terms (ops/residual.py) instead of an addmm_ each, a read and a write
  of (tokens x hidden) fewer per projection, in the forward and in the recompute (16-bit bases add theirs in the
  GEMM's epilogue already).
"""
import functools

import torch
from torch import nn
from transformers.modeling_layers import GradientCheckpointingLayer

from ..memory.layer_run import current_layer_run
from ..ops.residual import residual_add, unread_sum
from .binding import bind_forward, is_patched, plain_forward

# The children of a decoder layer whose forward is Llama's: norm, attention, residual add, norm, MLP, residual add
# (Llama, Mistral, Qwen2/3, Gemma 1). Gemma 2/3's extra norms and Phi-3's dropouts keep the family's forward.
_LLAMA_LAYOUT = {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}
# Where transformers checkpoints a layer: in its __call__ (5.17), which then calls the instance's forward (this
# one), or in the class's forward (later 5.x), which this one replaces and so must do the same.
_CHECKPOINTS_IN_FORWARD = "__call__" not in GradientCheckpointingLayer.__dict__


def _decoder_layer_forward(layer: nn.Module, hidden_states, *args, **kwargs):
    if args or kwargs.get("cache") is not None or kwargs.get("past_key_values") is not None:
        return plain_forward(layer)(hidden_states, *args, **kwargs)
    if _CHECKPOINTS_IN_FORWARD and layer.gradient_checkpointing and layer.training and torch.is_grad_enabled():
        return layer._gradient_checkpointing_func(functools.partial(_layer_forward, layer, **kwargs),
                                                  hidden_states)
    return _layer_forward(layer, hidden_states, **kwargs)


def _layer_forward(layer: nn.Module, hidden_states, **kwargs):
    # Each norm passes its input on to the residual add (rms_norm's pass_input), so that in backward the residual
    # stream's gradient is added into the norm's input gradient in the norm's pass, not by autograd after it.
    terms = {}
    normed, residual = layer.input_layernorm(hidden_states, pass_input=True)
    attended, _ = layer.self_attn(hidden_states=normed, output_terms=terms, **kwargs)
    hidden_states = residual_add(residual, attended, terms.pop("out", None))
    normed, residual = layer.post_attention_layernorm(hidden_states, pass_input=True)
    out = layer.mlp(normed, output_terms=terms)
    run = current_layer_run()
    if run is not None and not run.mlp_output_needed:  # a recompute: the MLP left out unwritten, the sum is unread
        return unread_sum(residual, out)
    return residual_add(residual, out, terms.pop("out", None))


def patch_decoder_layer(layer: nn.Module) -> bool:
    """Binds the forward above where the layer has Llama's layout and its norms, attention and MLP run on the kernels
    (their forwards take pass_input and output_terms); whether it did."""
    if {name for name, _ in layer.named_children()} != _LLAMA_LAYOUT:
        return False
    parts = (layer.self_attn, layer.mlp, layer.input_layernorm, layer.post_attention_layernorm)
    if not all(is_patched(part) for part in parts):
        return False
    bind_forward(layer, _decoder_layer_forward)
    return True
