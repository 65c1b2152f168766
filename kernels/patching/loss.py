"""The causal-LM head and loss on the fused linear + cross-entropy kernel.

With labels, in training, the (tokens x vocab) logits are never built: the output carries the loss
and no logits. Without labels, or in eval (where callers may want the logits), the model's own
forward runs.
"""
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..ops.fused_linear_ce import fused_linear_cross_entropy
from .binding import bind_forward, plain_forward

IGNORE_INDEX = -100
# Arguments that only the head uses; everything else goes to the backbone as the model's forward does.
_HEAD_ONLY_ARGS = ("labels", "shift_labels", "num_items_in_batch", "logits_to_keep")


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
    return CausalLMOutputWithPast(loss=loss, hidden_states=outputs.hidden_states, attentions=outputs.attentions)


def patch_causal_lm_loss(model: nn.Module) -> bool:
    if type(model.get_output_embeddings()) is not nn.Linear:
        return False
    bind_forward(model, _causal_lm_forward)
    return True
