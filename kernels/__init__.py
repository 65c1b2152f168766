"""lanner.kernels: Triton kernels and model patching for fast, light LoRA training.

Depends on torch, triton, transformers and peft only. `get_lora_model` is the entry point;
`patch_model` applies the kernels to a causal LM that is already wrapped by PEFT.

Names load on first use: run from the repository root, this folder is also importable as a
top-level `kernels`, which transformers probes for Hugging Face's kernel hub while it imports, so
importing this package must not import transformers or peft.
"""
import importlib

_EXPORTS = {
    "LoRAProjection": ".lora",
    "base_weight": ".lora",
    "gated_activation": ".lora",
    "lora_linear": ".lora",
    "lora_mlp": ".lora",
    "lora_qkv": ".lora",
    "register_base_weight": ".lora",
    "DEFAULT_TARGET_MODULES": ".lora_model",
    "get_lora_model": ".lora_model",
    "FAMILIES": ".patching",
    "PatchReport": ".patching",
    "has_fused_loss": ".patching",
    "layers_unpatched": ".patching",
    "patch_model": ".patching",
    "unpatch_model": ".patching",
    "NF4Linear": ".quant",
    "FP8Linear": ".quant",
    "load_fp8": ".quant",
    "register_base_matmul": ".lora",
    "dequantize_model": ".quant",
    "load_4bit": ".quant",
    "quantize_model": ".quant",
    "save_4bit": ".quant",
    "MLPStash": ".lora",
    "ExpertProjection": ".moe",
    "lora_moe_experts": ".moe",
    "pack_samples": ".packing",
    "install_memory_engine": ".memory",
    "memory_engine_of": ".memory",
    "plan_memory": ".memory",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name], __name__), name)


def __dir__():
    return __all__
