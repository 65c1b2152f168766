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
from torch.nn.utils.parametrize import type_before_parametrizations

from ..memory.layer_run import current_layer_run
from ..moe import ExpertProjection, lora_moe_experts
from ..ops.glu import ClampedSwiGLU
from ..peft_projections import first_blocker
from ..quant.nf4_experts import ExpertStackReader, is_nf4_stacked, nf4_stacked_names, nf4_stacked_shape
from .binding import bind_forward, plain_forward
from .families import family_of, glu_activation

EXPERT_WEIGHTS = ("gate_up_proj", "down_proj")


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


def _experts_type(experts: nn.Module) -> type:
    """The experts module's own class (an NF4-stored weight's parametrisation subclasses it)."""
    return type_before_parametrizations(experts)


def _is_gpt_oss(experts: nn.Module) -> bool:
    return _experts_type(experts).__name__ == "GptOssExperts"


def _nf4(experts: nn.Module) -> bool:
    return bool(nf4_stacked_names(experts))


def nf4_experts(module: nn.Module) -> bool:
    """Whether `module` is an experts module with NF4-stored weights, as the block holds it (under PEFT's
    wrappers or bare)."""
    return _nf4(_unwrap(module)[0])


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
    own_gate = vars(_experts_type(experts)).get("_apply_gate")
    if own_gate is not None and own_gate.__name__ != "_default_apply_gate":  # not transformers' act_fn(gate) * up
        return None
    act_fn = getattr(experts, "act_fn", None)
    return None if act_fn is None else glu_activation(act_fn)


def _dims(experts: nn.Module, weight: str) -> int | None:
    """How many dims a parameter of the experts has (an NF4-stored one's dense shape); None: not a parameter."""
    shape = nf4_stacked_shape(experts, weight)
    if shape is not None:
        return len(shape)
    param = experts._parameters.get(weight)
    return None if param is None else param.dim()


def experts_layout_blocker(experts: nn.Module) -> str | None:
    """Why the grouped kernels cannot run experts of this layout (the bare module, adapted or not: what
    is trained is moe_experts_blocker's question); None when they can."""
    name = _experts_type(experts).__name__
    layout = _layout(experts)
    weights = [*EXPERT_WEIGHTS, *(f"{weight}_bias" for weight in EXPERT_WEIGHTS if layout.biases)]
    for weight in weights:
        if _dims(experts, weight) != (2 if weight.endswith("_bias") else 3):
            return f"{name} has no stacked {weight}"
    unsupported = [what for what, present in {"no gate": not getattr(experts, "has_gate", True),
                                              "a post-expert norm": getattr(experts, "has_post_expert_norm", False)}.items()
                   if present]
    if unsupported:
        return f"{name} has {', '.join(unsupported)}"
    if _activation(experts) is None:
        act_fn = getattr(experts, "act_fn", None)
        return f"{name}'s activation {type(act_fn).__name__ if act_fn is not None else '(its own gate)'} has no GLU kernel"
    return None


def nf4_expert_stacks(model: nn.Module) -> tuple[list[tuple[nn.Module, str]], str | None]:
    """The stacked expert weights QLoRA stores in NF4, as (experts module, weight name), and why any others
    stay in 16 bits (None: there are none). The grouped kernels are the one reader that trains on NF4 experts
    (quant/nf4_experts.py), so experts they would not run stay dense. A rule on the model alone (its family and
    the experts' layout), so that an export rebuilds the base an adapter trained on by the same rule."""
    family = family_of(model)
    stacks, reason = [], None
    for module in model.modules():
        if not all(_dims(module, name) == 3 for name in EXPERT_WEIGHTS):
            continue
        if family is None or not family.moe:
            blocker = f"no kernels for mixtures of experts of model type {getattr(model.config, 'model_type', None)!r}"
        else:
            blocker = experts_layout_blocker(module)
        if blocker is None:
            stacks += [(module, name) for name in EXPERT_WEIGHTS]
        else:
            reason = f"NF4 experts train on the grouped kernels only, and {blocker}"
    return stacks, reason


def nest_like_dense_(model: nn.Module) -> None:
    """Puts PEFT's ParamWrappers over NF4-stored experts in the nesting they have over 16-bit ones. PEFT wraps a
    parametrised weight in the sorted order of the targets' names (down_proj innermost), a plain parameter in
    the module's order of its parameters (gate_up_proj innermost); the adapter's keys follow the nesting, so
    without this an adapter trained on NF4 experts would not load onto the 16-bit base (an export's)."""
    for parent in list(model.modules()):
        for attribute, outer in list(parent._modules.items()):
            if not isinstance(outer, ParamWrapper) or isinstance(parent, ParamWrapper):
                continue
            experts, wrappers = _unwrap(outer)
            if not _nf4(experts):
                continue
            chain = [experts]  # innermost first, in the dense module's order of its parameters
            for wrapper in sorted(wrappers.values(), key=lambda w: _registration_order(w.parameter_name)):
                wrapper._modules["base_layer"] = chain[-1]
                chain.append(wrapper)
            parent._modules[attribute] = chain[-1]


def _registration_order(weight: str) -> tuple[int, str]:
    return (EXPERT_WEIGHTS.index(weight) if weight in EXPERT_WEIGHTS else len(EXPERT_WEIGHTS), weight)


def moe_experts_blocker(module: nn.Module) -> str | None:
    """Why an MoE block's experts (`module`, as the block holds it) stay on transformers' forward. Experts
    stored in NF4 run on the grouped kernels adapted or not (frozen, they still dequantise per call there)."""
    experts, wrappers = _unwrap(module)
    name = _experts_type(experts).__name__
    if not wrappers and not _nf4(experts):
        return f"{name} is not LoRA-adapted (target_parameters has no expert weight)"
    if _layout(experts).biases and any(getattr(experts, f"{weight}_bias").requires_grad for weight in EXPERT_WEIGHTS):
        return f"{name} has trained expert biases"
    return experts_layout_blocker(experts)


def _frozen_weight(experts: nn.Module, weight_name: str, layout: _Layout):
    """The frozen weight as ExpertProjection takes it, [E, out, in] (a transposed view where stored [E, in, out])."""
    if is_nf4_stacked(experts, weight_name):
        return ExpertStackReader(experts, weight_name, layout.transposed)
    weight = getattr(experts, weight_name)
    return weight.transpose(1, 2) if layout.transposed else weight


def _projection(experts: nn.Module, weight_name: str, wrapper: ParamWrapper | None, layout: _Layout) -> ExpertProjection:
    weight = _frozen_weight(experts, weight_name, layout)
    bias = getattr(experts, f"{weight_name}_bias") if layout.biases else None
    if wrapper is None:
        return ExpertProjection(weight, bias=bias)
    name = next(name for name in wrapper.active_adapters if name in wrapper.lora_A)
    num_experts, rows, columns = nf4_stacked_shape(experts, weight_name) or experts._parameters[weight_name].shape
    out_features, in_features = (columns, rows) if layout.transposed else (rows, columns)
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
    gate_up, down = (_projection(experts, name, wrappers.get(name), layout) for name in EXPERT_WEIGHTS)
    run = current_layer_run()
    options = {}
    if run is not None:
        run.moe_experts_ran = True
        options = dict(stash=run.mlp_stash, output_needed=run.mlp_output_needed)
    return lora_moe_experts(hidden_states, top_k_index, top_k_weights, gate_up, down, _activation(experts),
                            interleaved=layout.interleaved, **options)


def _experts_forward(module: nn.Module, hidden_states, top_k_index, top_k_weights):
    experts, wrappers = _unwrap(module)
    if first_blocker(wrappers.values()) is not None:  # disable_adapter(), merged
        if _nf4(experts) and any(wrapper.merged for wrapper in wrappers.values()):
            # PEFT's merge added the delta to a dequantised copy, which is gone: the adapter is nowhere.
            raise RuntimeError(f"a LoRA adapter cannot merge into {_experts_type(experts).__name__}'s NF4-stored "
                               "weights: unmerge it, or dequantize_model first and merge into the dense weights")
        return plain_forward(module)(hidden_states, top_k_index, top_k_weights)
    return lora_experts(module, hidden_states, top_k_index, top_k_weights)


def patch_moe_experts(module: nn.Module) -> str | None:
    """Puts an MoE block's experts (`module`, as the block holds it: PEFT's outer ParamWrapper or the
    experts module) on the grouped kernels; returns why not, in words, when it cannot."""
    reason = moe_experts_blocker(module)
    if reason is None:
        bind_forward(module, _experts_forward)
    return reason
