"""Reading PEFT's LoRA layers as `LoRAProjection`s, and saying when the fast path must not run.

The fast path covers plain LoRA: one active adapter, no dropout, no DoRA or other variant, no LoRA
bias, a frozen dense base. Anything else runs PEFT's own forward.

Both functions run for every projection at every forward (and recompute), so they read the modules' own
dicts (`_modules`, `_parameters`, `__dict__`) instead of going through `nn.Module.__getattr__`, where a
missing attribute (`hasattr(base, "_hf_hook")`, PEFT's `get_base_layer` walk) costs an exception: ~36 us
a projection became ~10 on a CPU host that the GPU otherwise waits on (FP8 and MoE steps are host-bound).
"""
from __future__ import annotations

from peft.tuners.lora import LoraLayer
from peft.tuners.lora.layer import ParamWrapper
from torch import nn

from .lora import LoRAProjection, supports_base_layer
from .quant.nf4_experts import stored_parameter


def _base_layer(module: nn.Module) -> nn.Module:
    """PEFT's get_base_layer(): the innermost of nested base_layer modules."""
    while (inner := module._modules.get("base_layer")) is not None:
        module = inner
    return module


def _hooked(base: nn.Module) -> bool:
    return "_hf_hook" in base.__dict__  # accelerate's dispatch sets it as a plain attribute


def _frozen_base_blocker(base: nn.Module) -> str | None:
    if not supports_base_layer(base):
        return f"base layer type {type(base).__name__} has no dense weight reader"
    if _hooked(base):
        return "base layer is dispatched by accelerate hooks"
    for name, param in base._parameters.items():
        if param is None:
            continue
        if param.requires_grad:
            return f"base {name} is trainable"
        if param.is_meta:
            return f"base {name} is offloaded"
    return None


def _frozen_parameter_blocker(wrapper: ParamWrapper) -> str | None:
    """A LoRA on a parameter (target_parameters, e.g. the stacked expert weights of an MoE)."""
    base = wrapper.get_base_layer()
    param = stored_parameter(base, wrapper.parameter_name)  # not get_param(): an NF4 one would dequantise
    if _hooked(base):
        return "base layer is dispatched by accelerate hooks"
    if param.requires_grad:
        return f"base {wrapper.parameter_name} is trainable"
    if param.device.type == "meta":
        return f"base {wrapper.parameter_name} is offloaded"
    return None


def _active_adapter(module: LoraLayer) -> list[str]:
    factors = module._modules["lora_A"]._modules
    return [name for name in module.active_adapters if name in factors]


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
    active = _active_adapter(module)
    if len(active) != 1:
        return f"{len(active)} active adapters"
    name = active[0]
    if name in getattr(module, "lora_variant", {}) or module.use_dora.get(name, False):
        return "DoRA or another LoRA variant"
    parts = module._modules
    if not isinstance(parts["lora_dropout"]._modules[name], nn.Identity):
        return "lora_dropout > 0"
    factor_a, factor_b = parts["lora_A"]._modules[name], parts["lora_B"]._modules[name]
    if factor_b._parameters.get("bias") is not None:
        return "LoRA bias"
    if not isinstance(factor_a, nn.Linear):
        return f"LoRA factor type {type(factor_a).__name__}"
    if isinstance(module, ParamWrapper):
        return _frozen_parameter_blocker(module)
    return _frozen_base_blocker(_base_layer(module))


def lora_projection(module: nn.Module) -> LoRAProjection:
    """The projection as the kernels see it; call only when `fast_path_blocker(module)` is None."""
    if not isinstance(module, LoraLayer):
        return LoRAProjection(base=module)
    name = _active_adapter(module)[0]
    parts = module._modules
    return LoRAProjection(
        base=module.get_base_layer() if isinstance(module, ParamWrapper) else _base_layer(module),
        lora_A=parts["lora_A"]._modules[name]._parameters["weight"],
        lora_B=parts["lora_B"]._modules[name]._parameters["weight"],
        scaling=float(module.scaling[name]),
    )


def adapter_state(module: LoraLayer):
    """What a LoRA layer's forward reads besides tensors and can change between steps (the active adapters,
    whether they are disabled or merged, hooks), hashable: a CUDA graph of the layer stands only while it is
    unchanged (memory/graphs.py). Cheaper than fast_path_blocker, which it runs beside every step."""
    return (tuple(module.active_adapters), module.disable_adapters, module.merged,
            bool(module._forward_pre_hooks or module._forward_hooks))


def first_blocker(modules) -> str | None:
    for module in modules:
        reason = fast_path_blocker(module)
        if reason is not None:
            return reason
    return None
