"""The base weights a QLoRA adapter was trained against: the 16/32-bit checkpoint's linear layers
quantised to 4 bits and dequantised once, exactly as training stored and computed them. A QLoRA adapter is merged into these (and verified against them), never into the original
weights (which the adapter never saw) nor into re-quantised ones.

Which layers: every nn.Linear of the model except the output embedding (lm_head), as lanner.kernels'
quantize_model and transformers' bitsandbytes integration quantise them, and a mixture of experts'
stacked expert weights where the training record says lanner.kernels held them in NF4 (its own rule
says which); embeddings and norms stay dense. The round trip starts from the dtype training quantised from (the codes depend on it) and
dequantises into float32: the exact NF4 level x block absmax, rounded to 16 bits only once, after the
adapter is added. It runs on lanner.kernels' NF4 (quantize_nf4/dequantize, the code behind its
dequantize_model, which Lanner's QLoRA trains on; bitsandbytes' format and algorithm) and falls back
on bitsandbytes' functional quantize_4bit/dequantize_4bit (CPU or GPU) where the kernels are not
installed, or for FP4.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .files import ExportError

QUANT_TYPES = ("nf4", "fp4")
SOURCE_DTYPES = ("bfloat16", "float16", "float32")


@dataclass(frozen=True)
class Quantization:
    """How QLoRA training quantised the base (bitsandbytes' 4-bit settings). The defaults are
    Lanner's QLoRA (lanner.kernels' load_4bit): NF4 in blocks of 64, the block absmax double-quantised,
    quantised from the checkpoint's own dtype ("auto")."""
    quant_type: str = "nf4"
    blocksize: int = 64
    double_quant: bool = True
    dtype: str = "auto"   # the dtype the weights were quantised from: "auto" (the checkpoint's) or a name
    # A mixture of experts' stacked expert weights held in NF4 too (lanner.kernels' QLoRA since it stores them;
    # an adapter recorded before, or without the field, trained on 16-bit experts).
    experts: bool = False

    @classmethod
    def from_config(cls, config: dict | None) -> "Quantization":
        config = dict(config or {})
        unknown = set(config) - set(cls.__dataclass_fields__)
        if unknown:
            raise ExportError(f"Unknown 4-bit quantisation settings {sorted(unknown)}")
        q = cls(**config)
        if q.quant_type not in QUANT_TYPES:
            raise ExportError(f"4-bit quant_type must be one of {QUANT_TYPES}, not {q.quant_type!r}")
        if q.dtype not in ("auto", *SOURCE_DTYPES):
            raise ExportError(f"The dtype a QLoRA base was quantised from must be auto or one of {SOURCE_DTYPES}, "
                              f"not {q.dtype!r}")
        return q

    def as_dict(self) -> dict:
        return asdict(self)

    def source_dtype(self, base_model_dir: Path):
        """The torch dtype the weights were quantised from ("auto": the checkpoint's config.json)."""
        import torch

        name = self.dtype
        if name == "auto":
            config = json.loads((Path(base_model_dir) / "config.json").read_text())
            name = str(config.get("dtype") or config.get("torch_dtype") or "float32").replace("torch.", "")
            if name not in SOURCE_DTYPES:
                raise ExportError(f"The base checkpoint's dtype {name!r} is not one 4-bit training quantises from.")
        return getattr(torch, name)


def quantised_linears(model) -> list:
    """The nn.Linear modules bitsandbytes' 4-bit loading quantises: all but the output embedding."""
    import torch

    output = model.get_output_embeddings()
    return [module for module in model.modules()
            if isinstance(module, torch.nn.Linear) and module is not output]


def quantised_expert_stacks(model, quantization: Quantization) -> list:
    """(experts module, weight name) of the stacked expert weights training held in NF4: lanner.kernels' rule
    (nf4_expert_stacks), when the record says it stored experts."""
    if not quantization.experts:
        return []
    from lanner.kernels.patching.moe import nf4_expert_stacks

    return nf4_expert_stacks(model)[0]


def round_trip(weight, quantization: Quantization, source_dtype):
    """weight, as quantised from source_dtype, -> 4-bit -> float32, on weight's device."""
    import torch

    source = weight.detach().to(source_dtype).contiguous()
    if quantization.quant_type == "nf4":
        try:
            from lanner.kernels.quant import dequantize, quantize_nf4
        except ImportError:
            pass
        else:
            nf4 = quantize_nf4(source, quantization.blocksize, quantization.double_quant)
            return dequantize(nf4, torch.float32)
    from bitsandbytes import functional as bnb

    packed, state = bnb.quantize_4bit(source, blocksize=quantization.blocksize, quant_type=quantization.quant_type,
                                      compress_statistics=quantization.double_quant)
    state.dtype = torch.float32  # dequantise to the exact level x absmax, not rounded to 16 bits
    return bnb.dequantize_4bit(packed, state).float().reshape(weight.shape)


def dequantise_base_(model, quantization: Quantization, source_dtype) -> int:
    """Replace, in place, every quantised weight of `model` (linear layers; stacked experts where training
    held them in NF4) by its 4-bit round trip (in the model's dtype). Returns how many weights were replaced."""
    import torch

    weights = [module.weight for module in quantised_linears(model)]
    weights += [getattr(module, name) for module, name in quantised_expert_stacks(model, quantization)]
    with torch.no_grad():
        for weight in weights:
            weight.data = round_trip(weight, quantization, source_dtype).to(weight.dtype)
    return len(weights)
