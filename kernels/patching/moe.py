"""Mixture-of-experts blocks: the routed experts on the grouped LoRA kernels (kernels/moe.py).

Only the experts module's forward is replaced (transformers calls it as
`experts(hidden_states, top_k_index, top_k_weights)`); the family's router runs as before, so its
logits are recorded for transformers' load-balancing loss, its dtype and top-k rule are the family's,
and its gradient arrives through the routing weights. PEFT adapts the stacked expert weights with
`target_parameters` (one `ParamWrapper` per weight, nested around the experts module); the factors
are read as per-expert views of its 2D weights, without copies.

gpt-oss's experts run on the same kernels: weights stored [E, in, out], gate and up interleaved, a bias per
expert on each projection (frozen), and its clamped SwiGLU (ops/glu.py's ClampedSwiGLU).
"""
from __future__ import annotations

from dataclasses import dataclass

from peft.tuners.lora.layer import ParamWrapper
from torch import nn

from ..memory.layer_run import current_layer_run
from ..moe import ExpertProjection, lora_moe_experts
from ..ops.glu import ClampedSwiGLU
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


@dataclass(frozen=True)
class _Layout:
    transposed: bool  # weights [E, in, out]
    interleaved: bool  # gate and up in gate_up's even and odd columns
    biases: bool  # gate_up_proj_bias and down_proj_bias, [E, out]


def _is_gpt_oss(experts: nn.Module) -> bool:
    return type(experts).__name__ == "GptOssExperts"


def _layout(experts: nn.Module) -> _Layout:
    # transformers' use_experts_implementation flags; gpt-oss's own layout under a transformers without them.
    gpt_oss = _is_gpt_oss(experts)
    return _Layout(transposed=getattr(experts, "is_transposed", gpt_oss),
                   interleaved=not getattr(experts, "is_concatenated", not gpt_oss),
                   biases=getattr(experts, "has_bias", gpt_oss))


def _activation(experts: nn.Module):
    """The GLU between the experts' projections, as lora_moe_experts takes it; None where no kernel has it."""
    if _is_gpt_oss(experts):
        return ClampedSwiGLU(alpha=float(experts.alpha), limit=float(experts.limit))
    own_gate = vars(type(experts)).get("_apply_gate")
    if own_gate is not None and own_gate.__name__ != "_default_apply_gate":  # not transformers' act_fn(gate) * up
        return None
    act_fn = getattr(experts, "act_fn", None)
    return None if act_fn is None else glu_activation(act_fn)


def _layout_blocker(experts: nn.Module) -> str | None:
    name = type(experts).__name__
    layout = _layout(experts)
    weights = [*_EXPERT_WEIGHTS, *(f"{weight}_bias" for weight in _EXPERT_WEIGHTS if layout.biases)]
    for weight in weights:
        param = getattr(experts, weight, None)
        if not isinstance(param, nn.Parameter) or param.dim() != (2 if weight.endswith("_bias") else 3):
            return f"{name} has no stacked {weight}"
    unsupported = [what for what, present in {"no gate": not getattr(experts, "has_gate", True),
                                              "a post-expert norm": getattr(experts, "has_post_expert_norm", False)}.items()
                   if present]
    if layout.biases and any(getattr(experts, f"{weight}_bias").requires_grad for weight in _EXPERT_WEIGHTS):
        unsupported.append("trained expert biases")
    if unsupported:
        return f"{name} has {', '.join(unsupported)}"
    if _activation(experts) is None:
        act_fn = getattr(experts, "act_fn", None)
        return f"{name}'s activation {type(act_fn).__name__ if act_fn is not None else '(its own gate)'} has no GLU kernel"
    return None


def moe_experts_blocker(module: nn.Module) -> str | None:
    """Why an MoE block's experts (`module`, as the block holds it) stay on transformers' forward."""
    experts, wrappers = _unwrap(module)
    if not wrappers:
        return f"{type(experts).__name__} is not LoRA-adapted (target_parameters has no expert weight)"
    return _layout_blocker(experts)


def _projection(experts: nn.Module, weight_name: str, wrapper: ParamWrapper | None, layout: _Layout) -> ExpertProjection:
    weight = getattr(experts, weight_name)
    if layout.transposed:
        weight = weight.transpose(1, 2)  # [E, out, in], a view
    bias = getattr(experts, f"{weight_name}_bias") if layout.biases else None
    if wrapper is None:
        return ExpertProjection(weight, bias=bias)
    name = next(name for name in wrapper.active_adapters if name in wrapper.lora_A)
    num_experts, out_features, in_features = weight.shape
    A, B = wrapper.lora_A[name].weight, wrapper.lora_B[name].weight
    # PEFT's layout (ParamWrapper.get_delta_factors): A rows are (expert, rank), B columns (rank, expert), for
    # either weight layout.
    rank = A.shape[0] // num_experts
    return ExpertProjection(weight, A.view(num_experts, rank, in_features),
                            B.view(out_features, rank, num_experts).permute(2, 0, 1), float(wrapper.scaling[name]), bias)


def lora_experts(module: nn.Module, hidden_states, top_k_index, top_k_weights):
    """The LoRA-adapted experts' output on the grouped kernels (`module` as the block holds it), under the
    memory engine's options when a layer run is current."""
    experts, wrappers = _unwrap(module)
    layout = _layout(experts)
    gate_up, down = (_projection(experts, name, wrappers.get(name), layout) for name in _EXPERT_WEIGHTS)
    run = current_layer_run()
    options = {}
    if run is not None:
        run.moe_experts_ran = True
        options = dict(stash=run.mlp_stash, output_needed=run.mlp_output_needed)
    return lora_moe_experts(hidden_states, top_k_index, top_k_weights, gate_up, down, _activation(experts),
                            interleaved=layout.interleaved, **options)


def _experts_forward(module: nn.Module, hidden_states, top_k_index, top_k_weights):
    _, wrappers = _unwrap(module)
    if first_blocker(wrappers.values()) is not None:  # disable_adapter(), merged
        return plain_forward(module)(hidden_states, top_k_index, top_k_weights)
    return lora_experts(module, hidden_states, top_k_index, top_k_weights)


def patch_moe_experts(module: nn.Module) -> str | None:
    """Puts an MoE block's experts (`module`, as the block holds it: PEFT's outer ParamWrapper or the
    experts module) on the grouped kernels; returns why not, in words, when it cannot."""
    reason = moe_experts_blocker(module)
    if reason is None:
        bind_forward(module, _experts_forward)
    return reason
