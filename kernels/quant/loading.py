"""Loading a causal LM with NF4 base linears, and saving it in bitsandbytes' format.

Two kinds of checkpoint load:
- a 16-bit (or 32-bit) one is loaded as usual (on the CPU unless model_kwargs place it), then each
  linear layer is quantised on the target device one at a time (`quantize_model`), so the dense
  copy of a layer is freed as soon as its NF4 copy exists;
- one saved in bitsandbytes' 4-bit format (config.json's quantization_config says
  quant_method "bitsandbytes", load_in_4bit, bnb_4bit_quant_type "nf4") is loaded as stored: the
  model is built without weights, the saved codes and statistics become NF4Linear layers as they
  are, and everything else is loaded in the compute dtype. bitsandbytes is not needed.

`load_fp8` loads a 16-bit checkpoint and converts its linear layers to FP8 the same way.

`save_4bit` writes a checkpoint that transformers + bitsandbytes load as their own 4-bit model.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from ..ops.fp8_matmul import fp8_backend
from .convert import DEFAULT_SKIP_MODULES, _set_submodule, quantize_model
from .linear import NF4Linear
from .nf4 import BNB_STATE_KEYS, QUANT_STATE_KEY, from_bnb_state
from .nf4_experts import nf4_stacked_names

_QUANT_STATE_SUFFIX = ".weight." + QUANT_STATE_KEY


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def bnb_4bit_config(config) -> dict | None:
    """The checkpoint's quantization_config when it is a 4-bit bitsandbytes one (NF4 checked on load)."""
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        return None
    qc = qc if isinstance(qc, dict) else qc.to_dict()
    if qc.get("quant_method") != "bitsandbytes" or not qc.get("load_in_4bit"):
        raise ValueError(f"only bitsandbytes 4-bit NF4 checkpoints load in 4-bit; this one is quantised with "
                         f"{qc.get('quant_method')!r} ({'4' if qc.get('load_in_4bit') else '8'}-bit)")
    if qc.get("bnb_4bit_quant_type", "fp4") != "nf4":
        raise ValueError(f"only NF4 is supported, not bnb_4bit_quant_type={qc.get('bnb_4bit_quant_type', 'fp4')!r}")
    return qc


def _torch_dtype(value) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    return getattr(torch, str(value).removeprefix("torch."))


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (path / "model.safetensors").exists():
        shards = ["model.safetensors"]
    else:
        raise FileNotFoundError(f"{path}: no model.safetensors or model.safetensors.index.json")
    state = {}
    for shard in shards:
        state.update(load_file(path / shard, device="cpu"))
    return state


def load_prequantized(path: str | os.PathLike, device=None, dtype: torch.dtype | None = None, **from_config_kwargs):
    """A causal LM saved in bitsandbytes' 4-bit NF4 format, its 4-bit layers as NF4Linear over the saved
    storage. dtype: the compute dtype (default: the checkpoint's bnb_4bit_compute_dtype);
    from_config_kwargs (e.g. attn_implementation) go to AutoModelForCausalLM.from_config."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    path = Path(path)
    device = torch.device(device) if device is not None else default_device()
    config = AutoConfig.from_pretrained(path)
    qc = bnb_4bit_config(config)
    if qc is None:
        raise ValueError(f"{path} is not a bitsandbytes 4-bit checkpoint (no quantization_config)")
    dtype = dtype or _torch_dtype(qc.get("bnb_4bit_compute_dtype")) or _torch_dtype(config.dtype) or torch.float32
    del config.quantization_config
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, **from_config_kwargs)

    state = _read_safetensors(path)
    for name in sorted(k[: -len(_QUANT_STATE_SUFFIX)] for k in state if k.endswith(_QUANT_STATE_SUFFIX)):
        layer = model.get_submodule(name)
        if not isinstance(layer, nn.Linear):
            raise ValueError(f"{path}: {name} is stored in 4-bit but is a {type(layer).__name__}, not a linear layer")
        stats = {key: state.pop(f"{name}.weight.{key}") for key in BNB_STATE_KEYS if f"{name}.weight.{key}" in state}
        nf4 = from_bnb_state(state.pop(f"{name}.weight"), stats)
        if tuple(nf4.shape) != (layer.out_features, layer.in_features):
            raise ValueError(f"{path}: {name} holds a {tuple(nf4.shape)} weight; the model expects "
                             f"{(layer.out_features, layer.in_features)}")
        bias = state.pop(f"{name}.bias", None)
        _set_submodule(model, name, NF4Linear(nf4.to(device), None if bias is None else bias.to(device, dtype)))

    state = {k: v.to(device, dtype) if v.is_floating_point() else v.to(device) for k, v in state.items()}
    result = model.load_state_dict(state, strict=False, assign=True)
    if result.unexpected_keys:
        raise ValueError(f"{path}: tensors the model does not have: {result.unexpected_keys[:5]}")
    model.tie_weights()
    missing = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    if missing:
        raise ValueError(f"{path}: no saved weights for {missing[:5]}")
    model.to(device)
    return model.eval()


def load_4bit(path: str | os.PathLike, device=None, skip_modules=DEFAULT_SKIP_MODULES, **model_kwargs):
    """A causal LM from `path` with NF4 base linears on `device` (default: cuda when there is one):
    a bitsandbytes 4-bit checkpoint as stored, any other quantised on load (dtype "auto")."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if bnb_4bit_config(AutoConfig.from_pretrained(path)) is not None:
        unsupported = set(model_kwargs) - {"dtype", "attn_implementation"}
        if unsupported:
            raise ValueError(f"a bitsandbytes 4-bit checkpoint loads with dtype and attn_implementation only, "
                             f"not {sorted(unsupported)}")
        dtype = model_kwargs.pop("dtype", None)
        return load_prequantized(path, device, None if dtype == "auto" else _torch_dtype(dtype), **model_kwargs)
    model = AutoModelForCausalLM.from_pretrained(path, **{"dtype": "auto", **model_kwargs})
    if device is None and "device_map" not in model_kwargs:
        device = default_device()
    return quantize_model(model, device, skip_modules)


def load_fp8(path: str | os.PathLike, device=None, skip_modules=DEFAULT_SKIP_MODULES, **model_kwargs):
    """A causal LM from `path` with FP8 base linears on `device` (default: cuda when there is one),
    quantised on load from the checkpoint's 16-bit weights (dtype "auto"). On a CUDA GPU older than
    compute capability 8.9 this raises FP8Unsupported before reading the checkpoint."""
    from transformers import AutoModelForCausalLM

    if device is None and "device_map" not in model_kwargs:
        device = default_device()
    if device is not None:
        fp8_backend(torch.device(device))
    model = AutoModelForCausalLM.from_pretrained(path, **{"dtype": "auto", **model_kwargs})
    return quantize_model(model, device, skip_modules, quant_type="fp8")


def save_4bit(model: nn.Module, path: str | os.PathLike) -> None:
    """Saves a model with NF4Linear layers so that transformers + bitsandbytes load it as a 4-bit model
    (and `load_4bit` loads it back as stored)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    stacked = [name for name, module in base.named_modules() if nf4_stacked_names(module)]
    if stacked:
        raise ValueError(f"{stacked[0]}'s experts are stored in NF4, and bitsandbytes has no format for stacked "
                         "expert weights (transformers would not load them): dequantize_model them first, or "
                         "save the adapter and quantise the 16-bit base again on load")
    nf4 = [layer for layer in base.modules() if isinstance(layer, NF4Linear)]
    if not nf4:
        raise ValueError("the model has no NF4 layers to save in 4-bit")
    dense = [name for name, layer in base.named_modules() if type(layer) is nn.Linear]
    base.config.quantization_config = {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
        "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": all(layer.nf4.nested for layer in nf4),
        "bnb_4bit_compute_dtype": str(nf4[0].compute_dtype).removeprefix("torch."),
        "bnb_4bit_quant_storage": "uint8", "llm_int8_skip_modules": dense or None,
    }
    try:
        base.save_pretrained(path)
    finally:
        del base.config.quantization_config
