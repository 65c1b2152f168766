"""The entry point: a Hugging Face causal LM in, a standard PEFT LoRA model on the kernels out."""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, PreTrainedModel

from .patching import patch_model
from .patching.families import family_of, family_target_modules

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _load(model_or_path, model_kwargs: Mapping | None) -> PreTrainedModel:
    if isinstance(model_or_path, (str, os.PathLike)):
        return AutoModelForCausalLM.from_pretrained(model_or_path, **{"dtype": "auto", **(model_kwargs or {})})
    if model_kwargs:
        raise ValueError("model_kwargs apply only when a model id or path is given")
    return model_or_path


def get_lora_model(
    model_or_path: PreTrainedModel | str | os.PathLike,
    r: int = 16,
    lora_alpha: int = 16,
    target_modules: Sequence[str] | str = DEFAULT_TARGET_MODULES,
    lora_dropout: float = 0.0,
    use_kernels: bool = True,
    gradient_checkpointing: bool = True,
    *,
    model_kwargs: Mapping | None = None,
    **peft_kwargs,
) -> PeftModel:
    """A standard PEFT LoRA model whose hot paths (norms, RoPE, attention and MLP projections, loss)
    run on lanner's kernels.

    model_or_path: a loaded causal LM, or a model id/path for AutoModelForCausalLM.from_pretrained
    (with model_kwargs; dtype defaults to "auto"). target_modules use Llama's names; for Phi-3 they
    are mapped to its fused qkv_proj / gate_up_proj. gradient_checkpointing uses the non-reentrant
    form. Extra keyword arguments go to peft.LoraConfig. An unsupported model, or use_kernels=False,
    gives plain PEFT (logged once). The saved adapter is an ordinary PEFT adapter.
    """
    model = _load(model_or_path, model_kwargs)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    config = LoraConfig(
        r=r,
        lora_alpha=lora_alpha,
        target_modules=family_target_modules(family_of(model), target_modules),
        lora_dropout=lora_dropout,
        task_type="CAUSAL_LM",
        **peft_kwargs,
    )
    peft_model = get_peft_model(model, config)
    if use_kernels:
        patch_model(peft_model)
    return peft_model
