"""The entry point: a Hugging Face causal LM in, a standard PEFT LoRA model on the kernels out."""
from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping, Sequence

from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, PreTrainedModel

from .memory import install_memory_engine, use_expandable_segments
from .patching import patch_model
from .patching.families import family_of, family_target_modules, family_target_parameters
from .patching.moe import nest_like_dense_
from .quant.quantised_linear import QuantisedLinear

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _load(model_or_path, model_kwargs: Mapping | None, load_in_4bit: bool = False,
          load_in_fp8: bool = False) -> PreTrainedModel:
    if load_in_4bit and load_in_fp8:
        raise ValueError("load_in_4bit and load_in_fp8 are two formats of the base: choose one")
    if isinstance(model_or_path, (str, os.PathLike)):
        if load_in_4bit or load_in_fp8:
            from .quant import load_4bit, load_fp8

            return (load_4bit if load_in_4bit else load_fp8)(model_or_path, **(model_kwargs or {}))
        return AutoModelForCausalLM.from_pretrained(model_or_path, **{"dtype": "auto", **(model_kwargs or {})})
    if model_kwargs:
        raise ValueError("model_kwargs apply only when a model id or path is given")
    if load_in_4bit or load_in_fp8:
        from .quant import quantize_model

        return quantize_model(model_or_path, quant_type="nf4" if load_in_4bit else "fp8")
    return model_or_path


def _spelled_out(model, target_parameters: Sequence[str]) -> list[str]:
    """target_parameters with each that names a parametrised weight (an NF4-stored expert stack) given by its
    full name: PEFT matches those by full name only (the others as given, by suffix too)."""
    targets = list(target_parameters)
    for module_name, module in model.named_modules():
        parametrized = module._modules.get("parametrizations")
        for name in parametrized._modules if parametrized is not None else ():
            full = f"{module_name}.{name}"
            if any(full == target or full.endswith(f".{target}") for target in target_parameters):
                targets.append(full)
    return list(dict.fromkeys(targets))


def _without_parametrizations(model, target_modules, exclude_modules: Sequence[str] | str | None):
    """exclude_modules plus the modules holding parametrisations that target_modules would match (an NF4
    expert stack's is named after its weight, e.g. `experts.parametrizations.down_proj`, which a target
    "down_proj" matches), matched as PEFT matches: a regex in full, names as the key or its last parts."""
    def targeted(key: str) -> bool:
        if isinstance(target_modules, str):
            return re.fullmatch(target_modules, key) is not None
        return any(key == name or key.endswith(f".{name}") for name in target_modules)

    parametrized = [f"{name}.parametrizations.{weight}" for name, module in model.named_modules()
                    for weight in getattr(module._modules.get("parametrizations"), "_modules", ())]
    keys = [key for key in parametrized if targeted(key)]
    if not keys:
        return exclude_modules
    if isinstance(exclude_modules, str):  # a regex: one more alternative
        return "|".join([f"(?:{exclude_modules})", *(f"(?:{re.escape(key)})" for key in keys)])
    return [*(exclude_modules or ()), *keys]


def get_lora_model(
    model_or_path: PreTrainedModel | str | os.PathLike,
    r: int = 16,
    lora_alpha: int = 16,
    target_modules: Sequence[str] | str = DEFAULT_TARGET_MODULES,
    lora_dropout: float = 0.0,
    use_kernels: bool = True,
    gradient_checkpointing: bool = True,
    *,
    load_in_4bit: bool = False,
    load_in_fp8: bool = False,
    memory_budget_gib: float | None = None,
    offload_checkpoints: bool | None = None,
    model_kwargs: Mapping | None = None,
    **peft_kwargs,
) -> PeftModel:
    """A standard PEFT LoRA model whose hot paths (norms, RoPE, attention and MLP projections, loss)
    run on lanner's kernels.

    model_or_path: a loaded causal LM, or a model id/path for AutoModelForCausalLM.from_pretrained
    (with model_kwargs; dtype defaults to "auto"). target_modules use Llama's names; for Phi-3 they
    are mapped to its fused qkv_proj / gate_up_proj; for an MoE family (Qwen3-MoE, Mixtral)
    gate/up/down also target the experts' stacked weights (PEFT target_parameters, unless given).
    gradient_checkpointing uses the non-reentrant form. Extra keyword arguments go to
    peft.LoraConfig. An unsupported model, or use_kernels=False, gives plain PEFT (logged once). The
    saved adapter is an ordinary PEFT adapter.

    load_in_4bit: QLoRA. Every linear layer but lm_head becomes an NF4Linear (bitsandbytes' NF4
    storage, block size 64, double-quantised absmax), and a mixture of experts' stacked expert weights
    are stored in NF4 the same way where the grouped kernels run them (quant/nf4_experts.py; they then
    train on the kernels only): a loaded model is quantised where it lives; a
    path is loaded through `quant.load_4bit` (a bitsandbytes 4-bit checkpoint as stored, any other
    quantised on load onto the GPU when there is one). See docs/qlora.md.

    load_in_fp8: LoRA over an FP8 base. Every linear layer but lm_head (and any with a dimension not a
    multiple of 16) becomes an FP8Linear: e4m3 codes with a float32 scale per output channel, converted
    from the 16-bit weights, multiplied in FP8 on the tensor cores in forward and for the input
    gradient (CUDA compute capability 8.9 or newer; an exact float32 emulation on the CPU; an error in
    words on older GPUs). See docs/fp8.md.

    memory_budget_gib, offload_checkpoints: the memory engine (docs/memory-engine.md), on whenever
    gradient_checkpointing and the kernels are. With a budget, each decoder layer keeps, partly keeps
    or recomputes its activations so that the step's peak (torch.cuda.max_memory_allocated) stays
    under it; the plan is printed at the first training step. offload_checkpoints: True puts the
    checkpointed layer inputs (and a frozen, untied input-embedding table) in pinned host memory,
    False never, None when the budget needs it or, with no budget, when the layers run from CUDA graphs (the
    inputs only).
    """
    if use_kernels and isinstance(model_or_path, (str, os.PathLike)):
        use_expandable_segments()  # before the weights take their segments (memory/engine.py says why)
    model = _load(model_or_path, model_kwargs, load_in_4bit, load_in_fp8)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    family = family_of(model)
    if "target_parameters" not in peft_kwargs:
        peft_kwargs["target_parameters"] = family_target_parameters(family, target_modules) or None
    if peft_kwargs["target_parameters"]:
        peft_kwargs["target_parameters"] = _spelled_out(model, peft_kwargs["target_parameters"])
    target_modules = family_target_modules(family, target_modules)
    given_exclusions = peft_kwargs.get("exclude_modules")
    peft_kwargs["exclude_modules"] = _without_parametrizations(model, target_modules, given_exclusions)
    config = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        target_modules=target_modules,
        lora_dropout=lora_dropout,
        task_type="CAUSAL_LM",
        **peft_kwargs,
    )
    if config.use_dora and any(isinstance(module, QuantisedLinear) for module in model.modules()):
        raise ValueError("DoRA (use_dora) normalises each adapted layer's whole weight, which PEFT reads as a dense "
                         "tensor; an NF4 or FP8 base stores codes instead. Train DoRA on a 16-bit base, or LoRA on "
                         "this one")
    with warnings.catch_warnings():
        # PEFT moves some MoE families' MLP targets to their experts itself, after which the exclusions above
        # have nothing left to exclude: no news for the user.
        if given_exclusions is None:
            warnings.filterwarnings("ignore", message="You have passed exclude_modules=.* but no modules were excluded")
        peft_model = get_peft_model(model, config)
    nest_like_dense_(peft_model)
    if use_kernels:
        report = patch_model(peft_model)
        wants_engine = report.active or memory_budget_gib is not None or offload_checkpoints
        if gradient_checkpointing and wants_engine:
            install_memory_engine(peft_model, memory_budget_gib, offload_checkpoints)
    return peft_model
