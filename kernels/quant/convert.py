"""Swapping a model's linear layers to NF4 or FP8 and back.

`quantize_model` follows the peers' rule for what stays dense: every nn.Linear is quantised except
the output embedding (lm_head) and the modules named in `skip_modules`; embeddings are not linear
layers and stay dense too; in FP8, so do layers whose dimensions are not multiples of 16 (the FP8
GEMM's rule). In NF4 a mixture of experts' stacked expert weights are stored in NF4 as well where the
grouped kernels can train on them (quant/nf4_experts.py); FP8 leaves them in 16 bits. `dequantize_model`
gives every quantised layer back as an nn.Linear holding the dequantised weight (and NF4 experts their
dense parameters), so an adapter trained on the 4-bit base merges into exactly the base it was
trained against (never re-quantised). An FP8-trained adapter merges into the original 16-bit
weights instead (docs/fp8.md: the bound between the two).
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from ..ops.fp8_matmul import fp8_backend
from .fp8 import FP8Linear, fp8_alignable
from .linear import NF4Linear
from .nf4 import from_bnb_state, triton_available
from .nf4_experts import dense_experts_, is_nf4_stacked, store_nf4_stacked
from .quantised_linear import QuantisedLinear

log = logging.getLogger("lanner.kernels")

QUANT_TYPES = ("nf4", "fp8")

# Names bitsandbytes' transformers integration leaves dense besides the output embedding.
DEFAULT_SKIP_MODULES = ("lm_head",)


def _set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name) if parent_name else model, child, module)


def _skipped(name: str, skip: Iterable[str]) -> bool:
    return any(name == s or name.endswith(f".{s}") or f".{s}." in f".{name}." for s in skip)


def _bnb_linear4bit(module: nn.Module) -> bool:
    """A bitsandbytes Linear4bit (checked by name: bitsandbytes need not be installed)."""
    return type(module).__name__ in ("Linear4bit", "LinearNF4") and hasattr(module.weight, "quant_state")


def _from_bnb_linear4bit(layer: nn.Module) -> NF4Linear:
    state = layer.weight.quant_state
    if state.quant_type != "nf4":
        raise ValueError(f"only NF4 bitsandbytes layers can be converted, not {state.quant_type!r}")
    nf4 = from_bnb_state(layer.weight.data, state.as_dict(packed=True))
    bias = None if layer.bias is None else layer.bias.detach()
    return NF4Linear(nf4, bias)


@torch.no_grad()
def quantize_model(model: nn.Module, device=None, skip_modules: Iterable[str] = DEFAULT_SKIP_MODULES,
                   double_quant: bool = True, quant_type: str = "nf4") -> nn.Module:
    """Replaces, in place and one layer at a time, every nn.Linear by an NF4Linear (quant_type "nf4")
    or an FP8Linear ("fp8") quantised on `device` (default: where each weight lives), except the
    output embedding and `skip_modules` (and, in FP8, layers with a dimension not a multiple of 16);
    in NF4 also the stacked expert weights the grouped kernels train on (others: a warning in words).
    bitsandbytes' Linear4bit layers (a model loaded in 4-bit by transformers) become NF4Linear over
    the same storage. With `device`, the rest of the model moves there too. Returns the model.
    FP8 on a CUDA GPU older than compute capability 8.9 raises FP8Unsupported before any work."""
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type must be one of {QUANT_TYPES}, not {quant_type!r}")
    if quant_type == "fp8":
        fp8_backend(torch.device(device) if device is not None else next(model.parameters()).device)
    skip = set(skip_modules)
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for name, module in list(model.named_modules()):
        if isinstance(module, QuantisedLinear) or module is output or _skipped(name, skip):
            continue
        if quant_type == "nf4" and _bnb_linear4bit(module):
            _set_submodule(model, name, _from_bnb_linear4bit(module))
        elif type(module) is nn.Linear and (quant_type == "nf4" or fp8_alignable(module)):
            quantised = (NF4Linear.from_linear(module, device, double_quant=double_quant) if quant_type == "nf4"
                         else FP8Linear.from_linear(module, device))
            _set_submodule(model, name, quantised)
            module.weight = None  # free the dense weight now, not when the loop ends
    kept_dense = _store_experts_nf4(model, device, double_quant) if quant_type == "nf4" else \
        "FP8 quantises linear layers only"
    if device is not None:
        model.to(device)
    stacked = [p for p in model.parameters() if p.dim() == 3 and p.is_floating_point()]
    if stacked:
        log.warning("lanner.kernels: a mixture of experts' stacked expert weights (%.2f GiB) stay in %s: %s",
                    sum(p.numel() * p.element_size() for p in stacked) / 2**30, stacked[0].dtype, kept_dense)
    return model


def _store_experts_nf4(model: nn.Module, device, double_quant: bool) -> str | None:
    """Stores in NF4, one weight at a time on `device`, the stacked expert weights the grouped kernels can
    train on (patching.moe.nf4_expert_stacks) where they can run; returns why any others stay dense."""
    from ..patching.moe import nf4_expert_stacks

    stacks, reason = nf4_expert_stacks(model)
    stacks = [(module, name) for module, name in stacks if not is_nf4_stacked(module, name)]  # a second call
    target = torch.device(device) if device is not None else next(model.parameters()).device
    if stacks and not triton_available(target):
        return (f"NF4 experts train on the grouped kernels only, which need a CUDA device or TRITON_INTERPRET=1 "
                f"(the model is on {target.type})")
    for module, name in stacks:
        if device is not None:
            module._parameters[name] = nn.Parameter(module._parameters[name].detach().to(device), requires_grad=False)
        store_nf4_stacked(module, name, double_quant)
    return reason


@torch.no_grad()
def dequantize_model(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Replaces, in place, every NF4Linear or FP8Linear (also inside PEFT's LoRA layers) by an
    nn.Linear holding its dequantised weight in `dtype` (default: the dtype it was quantised from), and
    gives NF4-stored experts their dense parameters back likewise.
    Returns the model; a PEFT model can then `merge_and_unload()` into the dequantised base."""
    dense_experts_(model, dtype)
    for name, module in list(model.named_modules()):
        if isinstance(module, QuantisedLinear):
            weight = module.dense_weight(dtype)
            dense = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None,
                              device="meta", dtype=weight.dtype)
            dense.weight = nn.Parameter(weight, requires_grad=False)
            if module.bias is not None:
                dense.bias = nn.Parameter(module.bias.detach().to(weight.dtype), requires_grad=False)
            _set_submodule(model, name, dense)
    return model
