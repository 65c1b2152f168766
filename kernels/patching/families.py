"""The model families the kernels know, and what differs between them."""
from dataclasses import dataclass

from transformers import activations
from torch import nn


@dataclass(frozen=True)
class Family:
    name: str
    # RMSNorm: Gemma's scales by (1 + w) (offset 1); Gemma's and gpt-oss's round once, after the weight,
    # where Llama's rounds the normalised input before it.
    norm_offset: float = 0.0
    norm_cast_before_weight: bool = True
    # Phi-3 stores q/k/v as one qkv_proj and gate/up as one gate_up_proj.
    fused_projections: bool = False
    # gpt-oss's RoPE tables hold one cos/sin per rotated pair (head_dim / 2 wide), pairing dim i with
    # i + head_dim / 2; the others' repeat them over both halves.
    rope_pair_tables: bool = False
    # Mixture of experts: each expert's gate/up and down are slices of stacked 3D weights, which PEFT
    # adapts through target_parameters.
    moe: bool = False
    # Gemma 2 soft-caps its attention scores by config.attn_logit_softcapping. Gemma 3's config has the field
    # too, but its attention never reads it (transformers' forward passes no softcap), so neither do we.
    attention_softcap: bool = False


FAMILIES = {
    family.name: family
    for family in (
        Family("llama"),
        Family("mistral"),
        Family("qwen2"),
        Family("qwen3"),
        Family("qwen3_moe", moe=True),
        Family("mixtral", moe=True),
        Family("gpt_oss", norm_cast_before_weight=False, rope_pair_tables=True, moe=True),
        Family("gemma", norm_offset=1.0, norm_cast_before_weight=False),
        Family("gemma2", norm_offset=1.0, norm_cast_before_weight=False, attention_softcap=True),
        Family("gemma3_text", norm_offset=1.0, norm_cast_before_weight=False),
        Family("phi3", fused_projections=True),
    )
}

# The seven LoRA targets under Phi-3's names.
FUSED_TARGET_NAMES = {
    "q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj",
    "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj",
}


# The MLP targets under the stacked expert weights' names (gate and up are one concatenated weight).
MOE_TARGET_PARAMETERS = {
    "gate_proj": "experts.gate_up_proj", "up_proj": "experts.gate_up_proj", "down_proj": "experts.down_proj",
    "gate_up_proj": "experts.gate_up_proj",  # the stacked weight's own name
}


def family_of(model: nn.Module) -> Family | None:
    return FAMILIES.get(getattr(model.config, "model_type", None))


def family_target_modules(family: Family | None, target_modules):
    """target_modules in the family's own projection names (Phi-3's fused ones), order kept, no repeats."""
    if family is None or not family.fused_projections or isinstance(target_modules, str):
        return target_modules
    names = [FUSED_TARGET_NAMES.get(name, name) for name in target_modules]
    return list(dict.fromkeys(names))


def family_target_parameters(family: Family | None, target_modules) -> list[str]:
    """PEFT target_parameters for the experts of an MoE family whose MLP projections are targeted."""
    if family is None or not family.moe or isinstance(target_modules, str):
        return []
    names = (MOE_TARGET_PARAMETERS[name] for name in target_modules if name in MOE_TARGET_PARAMETERS)
    return list(dict.fromkeys(names))


def _gelu_tanh_classes():
    names = ("GELUTanh", "PytorchGELUTanh", "NewGELUActivation", "FastGELUActivation")
    return tuple(getattr(activations, name) for name in names if hasattr(activations, name))


def glu_activation(act_fn: nn.Module) -> str | None:
    """The GLU op's activation name for an MLP's act_fn module; None when the kernels have no such GLU."""
    if isinstance(act_fn, (nn.SiLU, activations.SiLUActivation)):
        return "silu"
    if isinstance(act_fn, _gelu_tanh_classes()):
        return "gelu_tanh"
    if type(act_fn) is activations.GELUActivation:
        return "gelu"
    return None
