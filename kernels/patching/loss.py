"""The causal-LM head and loss on the fused linear + cross-entropy kernel.

With labels, in training, the (tokens x vocab) logits are never built: the output carries the loss
and no logits. Without labels, or in eval (where callers may want the logits), the model's own
forward runs.
"""
import sys

import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast, MoeCausalLMOutputWithPast

from ..ops.fused_linear_ce import fused_linear_cross_entropy
from .binding import bind_forward, is_patched, plain_forward

IGNORE_INDEX = -100
# Arguments that only the head uses; everything else goes to the backbone as the model's forward does.
_HEAD_ONLY_ARGS = ("labels", "shift_labels", "num_items_in_batch", "logits_to_keep")


def _router_aux_loss(model: nn.Module, outputs, attention_mask):
    """An MoE model's load-balancing loss, by the model's own modeling module's function, as its forward
    computes it (router logits recorded from every layer's router)."""
    modeling = sys.modules[type(model).__module__]
    return modeling.load_balancing_loss_func(outputs.router_logits, model.num_experts, model.num_experts_per_tok,
                                             attention_mask)


def _can_fuse(model: nn.Module, args, kwargs) -> bool:
    head = model.get_output_embeddings()
    return (
        kwargs.get("labels") is not None
        and model.training
        and not args
        and kwargs.get("return_dict", True) is not False
        and type(head) is nn.Linear
    )


def _causal_lm_forward(model: nn.Module, *args, **kwargs):
    if not _can_fuse(model, args, kwargs):
        return plain_forward(model)(*args, **kwargs)
    labels, shift_labels = kwargs["labels"], kwargs.get("shift_labels")
    num_items_in_batch = kwargs.get("num_items_in_batch")
    backbone_kwargs = {key: value for key, value in kwargs.items() if key not in _HEAD_ONLY_ARGS}
    # No KV cache: the output carries none, and a cache would send attention through transformers' own forward
    # (config.use_cache is on unless gradient checkpointing turned it off).
    backbone_kwargs["use_cache"] = False
    is_moe = hasattr(model, "router_aux_loss_coef")
    if is_moe:
        requested = kwargs.get("output_router_logits")
        backbone_kwargs["output_router_logits"] = model.config.output_router_logits if requested is None else requested
    outputs = getattr(model, model.base_model_prefix)(**backbone_kwargs)

    hidden = outputs.last_hidden_state
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    head = model.get_output_embeddings()
    loss = fused_linear_cross_entropy(
        hidden.reshape(-1, hidden.shape[-1]),
        head.weight,
        shift_labels.reshape(-1).to(hidden.device),
        bias=head.bias,
        ignore_index=IGNORE_INDEX,
        num_items_in_batch=num_items_in_batch,
        softcap=getattr(model.config, "final_logit_softcapping", None),
    )
    if is_moe:
        aux_loss = None
        if backbone_kwargs["output_router_logits"]:
            aux_loss = _router_aux_loss(model, outputs, kwargs.get("attention_mask"))
            loss = loss + model.router_aux_loss_coef * aux_loss
        return MoeCausalLMOutputWithPast(loss=loss, aux_loss=aux_loss, hidden_states=outputs.hidden_states,
                                         attentions=outputs.attentions, router_logits=outputs.router_logits)
    return CausalLMOutputWithPast(loss=loss, hidden_states=outputs.hidden_states, attentions=outputs.attentions)


def patch_causal_lm_loss(model: nn.Module) -> bool:
    if type(model.get_output_embeddings()) is not nn.Linear:
        return False
    bind_forward(model, _causal_lm_forward)
    return True


def has_fused_loss(model: nn.Module) -> bool:
    """Whether the causal LM (or PEFT around one) computes its training loss with labels on the fused
    linear + cross-entropy kernel, so a trainer should call it with its labels."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return is_patched(base) and type(base.get_output_embeddings()) is nn.Linear
