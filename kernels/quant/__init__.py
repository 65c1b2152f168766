"""QLoRA storage: NF4 base weights in bitsandbytes' format, dequantised on demand for the LoRA kernels.

| module | one job |
|---|---|
| `nf4` | `NF4Weight`, quantise / dequantise, bitsandbytes' state-dict format |
| `linear` | `NF4Linear`, the frozen 4-bit layer, and its `base_weight` reader (a reused buffer) |
| `convert` | `quantize_model` (nn.Linear -> NF4Linear) and `dequantize_model` (back, for merging) |
| `loading` | `load_4bit` (quantise on load, or a bitsandbytes 4-bit checkpoint as stored), `save_4bit` |
"""
from .convert import dequantize_model, quantize_model
from .linear import NF4Linear, release_buffers
from .loading import load_4bit, load_prequantized, save_4bit
from .nf4 import NF4Weight, dequantize, quantize_nf4

__all__ = ["NF4Linear", "NF4Weight", "dequantize", "dequantize_model", "load_4bit", "load_prequantized",
           "quantize_model", "quantize_nf4", "release_buffers", "save_4bit"]
