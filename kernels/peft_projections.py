"""Reading PEFT's LoRA layers as `LoRAProjection`s, and saying when the fast path must not run.

The fast path covers plain LoRA: one active adapter, no dropout, no DoRA or other variant, no LoRA
bias, a frozen dense base. Anything else runs PEFT's own forward.
"""
from __future__ import annotations

from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import ParamWrapper
from torch import nn

from .lora import LoRAProjection, supports_base_layer


def _frozen_base_blocker(base: nn.Module) -> str | None:
    if not supports_base_layer(base):
        return f"base layer type {type(base).__name__} has no dense weight reader"
    if hasattr(base, "_hf_hook"):
        return "base layer is dispatched by accelerate hooks"
    for name, param in base.named_parameters(recurse=False):
        if param.requires_grad:
            return f"base {name} is trainable"
        if param.device.type == "meta":
            return f"base {name} is offloaded"
    return None


def _frozen_parameter_blocker(wrapper: ParamWrapper) -> str | None:
    """A LoRA on a parameter (target_parameters, e.g. the stacked expert weights of an MoE)."""
    base = wrapper.get_base_layer()
    param = wrapper.get_param()
    if hasattr(base, "_hf_hook"):
        return "base layer is dispatched by accelerate hooks"
    if param.requires_grad:
        return f"base {wrapper.parameter_name} is trainable"
    if param.device.type == "meta":
        return f"base {wrapper.parameter_name} is offloaded"
    return None


def fast_path_blocker(module: nn.Module) -> str | None:
    """Why `module` (a projection, adapted or not, or a LoRA on an expert weight) cannot run on the LoRA
    kernels now; None when it can."""
    if not isinstance(module, LoraLayer):
        return _frozen_base_blocker(module)
    if module._forward_pre_hooks or module._forward_hooks:
        return "LoRA layer has forward hooks"
    if module.disable_adapters or module.merged:
        return "adapters are disabled or merged"
    if getattr(module, "fan_in_fan_out", False):
        return "fan_in_fan_out layers"
    active = [name for name in module.active_adapters if name in module.lora_A]
    if len(active) != 1:
        return f"{len(active)} active adapters"
    name = active[0]
    if name in getattr(module, "lora_variant", {}) or module.use_dora.get(name, False):
        return "DoRA or another LoRA variant"
    if not isinstance(module.lora_dropout[name], nn.Identity):
        return "lora_dropout > 0"
    if module.lora_B[name].bias is not None:
        return "LoRA bias"
    if not isinstance(module.lora_A[name], nn.Linear):
        return f"LoRA factor type {type(module.lora_A[name]).__name__}"
    if isinstance(module, ParamWrapper):
        return _frozen_parameter_blocker(module)
    return _frozen_base_blocker(module.get_base_layer())


def lora_projection(module: nn.Module) -> LoRAProjection:
    """The projection as the kernels see it; call only when `fast_path_blocker(module)` is None."""
    if not isinstance(module, LoraLayer):
        return LoRAProjection(base=module)
    name = next(name for name in module.active_adapters if name in module.lora_A)
    return LoRAProjection(
        base=module.get_base_layer(),
        lora_A=module.lora_A[name].weight,
        lora_B=module.lora_B[name].weight,
        scaling=float(module.scaling[name]),
    )


def first_blocker(modules) -> str | None:
    for module in modules:
        reason = fast_path_blocker(module)
        if reason is not None:
            return reason
    return None
