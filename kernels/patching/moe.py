"""Mixture-of-experts blocks: the routed experts on the grouped LoRA kernels (kernels/moe.py).

Only the experts module's forward is replaced (transformers calls it as
`experts(hidden_states, top_k_index, top_k_weights)`); the family's router runs as before, so its
logits are recorded for transformers' load-balancing loss, its dtype and top-k rule are the family's,
and its gradient arrives through the routing weights. PEFT adapts the stacked expert weights with
`target_parameters` (one `ParamWrapper` per weight, nested around the experts module); the factors
are read as per-expert views of its 2D weights, without copies.
"""
from __future__ import annotations

from peft.tuners.lora.layer import ParamWrapper
from torch import nn

from ..memory.layer_run import current_layer_run
from ..moe import ExpertProjection, lora_moe_experts
from ..peft_projections import first_blocker
from .binding import bind_forward, plain_forward
from .families import glu_activation

_EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


def _unwrap(module: nn.Module) -> tuple[nn.Module, dict[str, ParamWrapper]]:
    """The experts module under PEFT's nested ParamWrappers, and the wrappers by parameter name."""
    wrappers = {}
    while isinstance(module, ParamWrapper):
        wrappers[module.parameter_name] = module
        module = module.base_layer
    return module, wrappers


def _layout_blocker(experts: nn.Module) -> str | None:
    name = type(experts).__name__
    for weight in _EXPERT_WEIGHTS:
        param = getattr(experts, weight, None)
        if not isinstance(param, nn.Parameter) or param.dim() != 3:
            return f"{name} has no stacked {weight} weight"
    # transformers' use_experts_implementation flags: gpt-oss stores [E, in, out], interleaves gate and
    # up, has biases and a clamped GLU; none of that is on the grouped kernel.
    layout = {"transposed weights": getattr(experts, "is_transposed", False),
              "expert biases": getattr(experts, "has_bias", False),
              "interleaved gate/up": not getattr(experts, "is_concatenated", True),
              "no gate": not getattr(experts, "has_gate", True),
              "a post-expert norm": getattr(experts, "has_post_expert_norm", False)}
    unsupported = [what for what, present in layout.items() if present]
    if unsupported:
        return f"{name} has {', '.join(unsupported)}"
    act_fn = getattr(experts, "act_fn", None)
    if act_fn is None or glu_activation(act_fn) is None:
        return f"{name}'s activation {type(act_fn).__name__} has no GLU kernel"
    return None


def moe_experts_blocker(module: nn.Module) -> str | None:
    """Why an MoE block's experts (`module`, as the block holds it) stay on transformers' forward."""
    experts, wrappers = _unwrap(module)
    if not wrappers:
        return f"{type(experts).__name__} is not LoRA-adapted (target_parameters has no expert weight)"
    return _layout_blocker(experts)


def _projection(experts: nn.Module, weight_name: str, wrapper: ParamWrapper | None) -> ExpertProjection:
    weight = getattr(experts, weight_name)
    if wrapper is None:
        return ExpertProjection(weight)
    name = next(name for name in wrapper.active_adapters if name in wrapper.lora_A)
    num_experts, out_features, in_features = weight.shape
    A, B = wrapper.lora_A[name].weight, wrapper.lora_B[name].weight
    # PEFT's layout (ParamWrapper.get_delta_factors): A rows are (expert, rank), B columns (rank, expert).
    rank = A.shape[0] // num_experts
    return ExpertProjection(weight, A.view(num_experts, rank, in_features),
                            B.view(out_features, rank, num_experts).permute(2, 0, 1), float(wrapper.scaling[name]))


def _experts_forward(module: nn.Module, hidden_states, top_k_index, top_k_weights, *, activation: str):
    experts, wrappers = _unwrap(module)
    if first_blocker(wrappers.values()) is not None:  # disable_adapter(), merged
        return plain_forward(module)(hidden_states, top_k_index, top_k_weights)
    gate_up, down = (_projection(experts, name, wrappers.get(name)) for name in _EXPERT_WEIGHTS)
    run = current_layer_run()
    if run is None:
        return lora_moe_experts(hidden_states, top_k_index, top_k_weights, gate_up, down, activation)
    run.moe_experts_ran = True
    return lora_moe_experts(hidden_states, top_k_index, top_k_weights, gate_up, down, activation,
                            stash=run.mlp_stash, output_needed=run.mlp_output_needed)


def patch_moe_experts(module: nn.Module) -> str | None:
    """Puts an MoE block's experts (`module`, as the block holds it: PEFT's outer ParamWrapper or the
    experts module) on the grouped kernels; returns why not, in words, when it cannot."""
    reason = moe_experts_blocker(module)
    if reason is None:
        experts, _ = _unwrap(module)
        bind_forward(module, _experts_forward, activation=glu_activation(experts.act_fn))
    return reason
