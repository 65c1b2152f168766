"""The model a job trains: resolved from its id, loaded on this process's device, wrapped with LoRA,
and put on lanner.kernels when the job wants them and they can run here."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lanner.backend.settings import Settings
from lanner.worker.default_model import DEFAULT_MODEL_ID, imported_model_dir
from lanner.worker.events import JobEvents
from lanner.worker.training.options import TrainingOptions

DEFAULT_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def resolve_model(model: str, settings: Settings) -> str:
    """The built-in model's imported copy, a local path, or a hub id (as given)."""
    if model == DEFAULT_MODEL_ID:
        return str(imported_model_dir(settings.models_dir))
    local = Path(model).expanduser()
    if not local.is_absolute():
        local = settings.models_dir / model
    return str(local) if local.exists() else model


def training_dtype(options: TrainingOptions) -> torch.dtype:
    if options.dtype != "auto":
        return getattr(torch, options.dtype)
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def load_tokenizer(path: str, options: TrainingOptions):
    tokenizer = AutoTokenizer.from_pretrained(path)
    if options.chat_template:
        tokenizer.chat_template = options.chat_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_lora_model(path: str, options: TrainingOptions, events: JobEvents):
    from lanner.kernels import get_lora_model, patch_model

    dtype = training_dtype(options)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if torch.cuda.is_available():
        model.to("cuda")  # before patching: the kernels check the device the weights are on
    lora = get_lora_model(model, r=options.lora_r, lora_alpha=options.lora_alpha,
                          target_modules=options.target_modules or DEFAULT_TARGET_MODULES,
                          lora_dropout=options.lora_dropout, use_kernels=False,
                          gradient_checkpointing=options.gradient_checkpointing)
    if not options.use_kernels:
        events.log("lanner.kernels: off (the job's use_kernels option); plain PEFT")
    else:
        report = patch_model(lora)
        if report.active:
            events.log(f"lanner.kernels: on for {report.family} ({dict(report.patched)})")
        else:
            events.log(f"lanner.kernels: not used — {report.fallback_reason}; plain PEFT", level="warning")
    trainable = sum(p.numel() for p in lora.parameters() if p.requires_grad)
    total = sum(p.numel() for p in lora.parameters())
    events.log(f"Model {path} in {str(dtype).removeprefix('torch.')}: {trainable:,} trainable of {total:,} parameters")
    return lora
