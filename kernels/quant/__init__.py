"""Quantised frozen bases: NF4 (bitsandbytes' format, dequantised on demand for the LoRA kernels) and FP8
(multiplied in FP8).

| module | one job |
|---|---|
| `nf4` | `NF4Weight`, quantise / dequantise, bitsandbytes' state-dict format |
| `linear` | `NF4Linear`, the frozen 4-bit layer, and its `base_weight` reader (a reused buffer) |
| `fp8` | `FP8Weight`, `FP8Linear`: e4m3 base weights multiplied in FP8 (docs/fp8.md) |
| `quantised_linear` | `QuantisedLinear`, what both frozen layers share, and the shared scratch buffers |
| `nf4_experts` | a mixture of experts' stacked expert weights in NF4 (a parametrisation), and their readers |
| `convert` | `quantize_model` (nn.Linear -> NF4Linear or FP8Linear; stacked experts -> NF4) and `dequantize_model` (back, for merging) |
| `loading` | `load_4bit` (quantise on load, or a bitsandbytes 4-bit checkpoint as stored), `save_4bit`, `load_fp8` |
"""
from .convert import dequantize_model, quantize_model
from .fp8 import FP8Linear, FP8Weight, dequantize_fp8, quantize_fp8
from .linear import NF4Linear
from .quantised_linear import QuantisedLinear, release_buffers
from .loading import load_4bit, load_fp8, load_prequantized, save_4bit
from .nf4 import NF4Weight, dequantize, quantize_nf4

__all__ = ["FP8Linear", "FP8Weight", "NF4Linear", "NF4Weight", "QuantisedLinear", "dequantize", "dequantize_fp8",
           "dequantize_model", "load_4bit", "load_fp8", "load_prequantized", "quantize_fp8", "quantize_model", "quantize_nf4",
           "release_buffers", "save_4bit"]
