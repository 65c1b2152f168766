"""The table that drives the GGUF converter: for each Hugging Face `model_type`, the llama.cpp
architecture it becomes, how its weights must be transformed, and which hyperparameters go into the
metadata. Tensor names are mapped by the gguf package's own TensorNameMap for that architecture.

To add an architecture: add an ArchSpec here (and a tokenizer pre-type in gguf_tokenizer if new),
then a test on a tiny random-init model saved with save_pretrained (tests/export/test_gguf_archs.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import gguf
import numpy as np

from .files import ExportError


def permute_for_llama_rope(weights: np.ndarray, n_head: int) -> np.ndarray:
    """Reorder q_proj/k_proj rows from Hugging Face's rotate-half RoPE layout (the two halves of each
    head) to llama.cpp's interleaved pairs, as llama.cpp's LLAMA architecture expects. For k_proj,
    n_head is the number of key/value heads. Without it the model loads but talks nonsense."""
    rows = weights.shape[0]
    return (weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


@dataclass(frozen=True)
class ArchSpec:
    arch: gguf.MODEL_ARCH
    # llama.cpp's LLAMA rope is the interleaved (GPT-J) form: q/k rows must be permuted.
    # QWEN2/QWEN3 use the NeoX (rotate-half) form, the same as Hugging Face: no permutation.
    permute_qk: bool
    # Config keys written as metadata: (GGUFWriter method, config attribute).
    hparams: tuple[tuple[str, str], ...] = (
        ("add_context_length", "max_position_embeddings"),
        ("add_embedding_length", "hidden_size"),
        ("add_block_count", "num_hidden_layers"),
        ("add_feed_forward_length", "intermediate_size"),
        ("add_head_count", "num_attention_heads"),
        ("add_head_count_kv", "num_key_value_heads"),
        ("add_layer_norm_rms_eps", "rms_norm_eps"),
    )
    # Added to every RMSNorm weight: Gemma's HF norms compute x * (1 + w), llama.cpp's x * w.
    norm_offset: float = 0.0
    # Write attention key/value head sizes even when they equal hidden/heads.
    always_head_dim: bool = False
    # Tensors of the HF checkpoint that have no place in the GGUF.
    skip_suffixes: tuple[str, ...] = ("rotary_emb.inv_freq",)
    notes: str = ""

    @property
    def name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.arch]


ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": ArchSpec(gguf.MODEL_ARCH.LLAMA, permute_qk=True),
    # Mistral 7B is the Llama graph in llama.cpp (its sliding window is not applied there).
    "mistral": ArchSpec(gguf.MODEL_ARCH.LLAMA, permute_qk=True,
                        notes="llama.cpp runs Mistral as LLAMA; sliding-window attention is not applied"),
    "qwen2": ArchSpec(gguf.MODEL_ARCH.QWEN2, permute_qk=False),
    # Gemma 1: NeoX rope, norms stored as w - 1, embeddings scaled by sqrt(hidden) inside llama.cpp.
    "gemma": ArchSpec(gguf.MODEL_ARCH.GEMMA, permute_qk=False, norm_offset=1.0, always_head_dim=True),
    "qwen3": ArchSpec(gguf.MODEL_ARCH.QWEN3, permute_qk=False),
}


def arch_for(config: dict) -> ArchSpec:
    model_type = config.get("model_type")
    spec = ARCHITECTURES.get(model_type)
    if spec is None:
        raise ExportError(
            f"GGUF export does not support the {model_type!r} architecture yet "
            f"(supported: {', '.join(sorted(ARCHITECTURES))}).")
    return spec


def rope_settings(config: dict) -> dict:
    """rope_theta and scaling from either transformers 5 (`rope_parameters`) or 4 (`rope_theta`,
    `rope_scaling`). Only the scaling types llama.cpp reads from metadata alone are accepted."""
    params = dict(config.get("rope_parameters") or {})
    if "rope_theta" not in params and "rope_theta" in config:
        params["rope_theta"] = config["rope_theta"]
    scaling = config.get("rope_scaling") or {}
    params.update({k: v for k, v in scaling.items() if k not in params})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in ("default", "linear", "yarn", "llama3"):
        raise ExportError(f"RoPE scaling {rope_type!r} is not supported by the GGUF export yet.")
    return {"theta": float(params.get("rope_theta", 10000.0)), "type": rope_type,
            "factor": params.get("factor"), "low_freq_factor": params.get("low_freq_factor", 1.0),
            "high_freq_factor": params.get("high_freq_factor", 4.0),
            "original_max_position_embeddings": params.get("original_max_position_embeddings")}


def llama3_rope_factors(rope: dict, head_dim: int) -> np.ndarray:
    """Llama 3.1+ RoPE scaling as llama.cpp applies it: a `rope_freqs` tensor of per-frequency
    divisors (transformers computes the same in _compute_llama3_parameters)."""
    base, factor = rope["theta"], float(rope["factor"] or 8.0)
    low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    old_context = float(rope["original_max_position_embeddings"] or 8192)
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:
            factors.append(1.0)
        elif wavelen > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


@dataclass
class ModelShape:
    n_head: int
    n_head_kv: int
    head_dim: int
    n_layers: int
    hidden: int
    extra: dict = field(default_factory=dict)


def model_shape(config: dict) -> ModelShape:
    n_head = config["num_attention_heads"]
    hidden = config["hidden_size"]
    return ModelShape(n_head=n_head, n_head_kv=config.get("num_key_value_heads") or n_head,
                      head_dim=config.get("head_dim") or hidden // n_head,
                      n_layers=config["num_hidden_layers"], hidden=hidden)
