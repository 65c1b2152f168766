"""Putting a model's hot paths on the kernels, module by module, per instance."""
from __future__ import annotations

import logging
import os
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field

from torch import nn

from ..attention.transformers_glue import ATTENTION_NAME, restore_attention, use_lanner_attention
from ..peft_projections import fast_path_blocker
from .attention import patch_attention
from .binding import is_patched, plain_forwards, unbind_forward
from .families import FAMILIES, Family, family_of
from .layers import patch_decoder_layer
from .loss import patch_causal_lm_loss
from .mlp import patch_mlp
from .moe import nf4_experts, patch_moe_experts
from .norms import is_rms_norm, norms_feeding_fp8, patch_rms_norm

logger = logging.getLogger("lanner.kernels")


@dataclass
class PatchReport:
    """What runs on the kernels after patching (module counts per kind), or why nothing does."""

    family: str | None = None
    patched: Counter = field(default_factory=Counter)
    fallback_reason: str | None = None

    @property
    def active(self) -> bool:
        return self.fallback_reason is None


def _unsupported_reason(model: nn.Module, family: Family | None) -> str | None:
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if family is None:
        return f"no kernels for model type {model_type!r} (supported: {', '.join(sorted(FAMILIES))})"
    if not type(model).__name__.endswith("ForCausalLM"):
        return f"{type(model).__name__} is not a causal LM"
    device = next(model.parameters()).device
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"the Triton kernels need a CUDA device; the model is on {device.type}"
    return None


def _projection_blocker(model: nn.Module) -> str | None:
    """A LoRA feature the fast path lacks, found once at patch time (PEFT's projections then run)."""
    for name, module in model.named_modules():
        if hasattr(module, "lora_A"):
            reason = fast_path_blocker(module)
            if reason is not None:
                return f"{name}: {reason}"
    return None


def patch_model(model: nn.Module) -> PatchReport:
    """Puts a (PEFT-wrapped or plain) Hugging Face causal LM's hot paths on the kernels, in place.

    RMSNorms, the decoder layers' attention (q/k/v/o projections and RoPE), MLP blocks, LoRA-adapted
    mixture-of-experts experts, the decoder layers of Llama's layout (patching/layers.py), and the loss. Returns
    what was patched; an unsupported model is left untouched and logged once.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    family = family_of(base)
    reason = _unsupported_reason(base, family)
    if reason is not None:
        logger.warning("lanner.kernels: %s; training runs on plain PEFT", reason)
        return PatchReport(fallback_reason=reason)

    report = PatchReport(family=family.name)
    fallbacks = set()
    for module in base.modules():
        if is_rms_norm(module):
            patch_rms_norm(module, family.norm_offset, family.norm_cast_before_weight)
            report.patched["rms_norm"] += 1
    for layer in getattr(base, base.base_model_prefix).layers:
        for norm in norms_feeding_fp8(layer):
            patch_rms_norm(norm, family.norm_offset, family.norm_cast_before_weight, quantise_for_fp8=True)
        if hasattr(layer, "self_attn"):
            reason = patch_attention(layer.self_attn, family.rope_pair_tables, family.attention_softcap)
            if reason is None:
                report.patched["attention"] += 1
            else:
                fallbacks.add(f"attention runs on transformers' forward and attention ({reason})")
        mlp = getattr(layer, "mlp", None)
        if mlp is not None and hasattr(mlp, "experts"):
            reason = patch_moe_experts(mlp.experts)
            if reason is None:
                report.patched["moe_experts"] += 1
            else:
                fallbacks.add(f"MoE experts run on transformers' forward ({reason})")
        elif mlp is not None:
            reason = patch_mlp(mlp)
            if reason is None:
                report.patched["mlp"] += 1
            else:
                fallbacks.add(f"the MLP runs on transformers' forward ({reason})")
        if patch_decoder_layer(layer):
            report.patched["decoder_layer"] += 1
    if patch_causal_lm_loss(base):
        report.patched["loss"] += 1
    if report.patched["attention"]:
        if use_lanner_attention(base):
            report.patched["attention_path"] += 1
        else:
            logger.warning("lanner.kernels: attention implementation %r kept (ours replaces %s)",
                           base.config._attn_implementation, "sdpa, eager, flex and flash")

    for fallback in sorted(fallbacks):
        logger.warning("lanner.kernels: %s", fallback)
    blocker = _projection_blocker(base)
    if blocker is not None:
        logger.warning("lanner.kernels: LoRA projections run on PEFT's forward (%s); norms, RoPE and loss run on kernels", blocker)
    logger.info("lanner.kernels: %s patched: %s", family.name, dict(report.patched))
    return report


def unpatch_model(model: nn.Module) -> None:
    """Restores every forward that patch_model replaced, and the model's own attention implementation."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    restore_attention(base)
    for module in base.modules():
        if is_patched(module):
            unbind_forward(module)


@contextmanager
def layers_unpatched(model: nn.Module):
    """Inside the block the decoder layers run their own forwards (norms, attention, MLPs, experts but NF4 ones)
    and the model its own attention implementation, as after unpatch_model; after it, the kernels again. For
    decoding with a KV cache, a few tokens a call, where the kernels gain nothing and cost their per-call
    overhead. The causal LM's own forward (the loss) is left as it is: a trainer may have wrapped it."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    ours = base.config._attn_implementation == ATTENTION_NAME
    restore_attention(base)
    try:
        # NF4-stored experts keep the kernels: PEFT's own forward cannot adapt them (quant/nf4_experts.py).
        with plain_forwards(module for module in base.modules() if module is not base and not nf4_experts(module)):
            yield
    finally:
        if ours:
            use_lanner_attention(base)
