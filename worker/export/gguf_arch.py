"""The table that drives the GGUF converter: for each Hugging Face `model_type`, the llama.cpp
architecture it becomes, how its weights must be transformed, and which hyperparameters go into the
metadata. Tensor names are mapped by the gguf package's own TensorNameMap for that architecture.

To add an architecture: add an ArchSpec here (and a tokenizer pre-type in gguf_tokenizer if new),
then a test on a tiny random-init model saved with save_pretrained (tests/export/test_gguf_archs.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

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
    # Metadata only this architecture has (soft-capping, sliding window), written after the common keys.
    extra_metadata: Callable[[gguf.GGUFWriter, dict], None] | None = None
    # A factor folded into the queries (into this GGUF tensor, e.g. "attn_q" or "attn_q_norm"), for an
    # attention scale llama.cpp fixes where Hugging Face reads it from the config.
    query_scale: Callable[[dict], float] | None = None
    query_scale_tensor: str = ""
    # Why llama.cpp's graph cannot run this model's config (None: it can), checked before anything is written.
    unsupported: Callable[[dict], str | None] | None = None
    # Stacked experts saved [experts, in, out] with gate and up in alternate columns of gate_up_proj, and
    # per-expert biases beside them (gpt-oss), where the others save [experts, out, in], gate rows before up.
    experts_in_out_interleaved: bool = False
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
    # Gemma 2: Gemma 1 plus post-attention/post-FFN norms, attention and final logit soft-capping,
    # sliding-window attention on every other layer.
    "gemma2": ArchSpec(gguf.MODEL_ARCH.GEMMA2, permute_qk=False, norm_offset=1.0, always_head_dim=True,
                       extra_metadata=lambda writer, config: _gemma2_metadata(writer, config),
                       query_scale=lambda config: gemma_query_scale(config, layers_27b=46),
                       query_scale_tensor="attn_q"),
    # Gemma 3 (text; Gemma3ForCausalLM): Gemma 2's norms plus q/k norms, no attention soft-capping,
    # 5 sliding-window layers to 1 global one, each kind with its own RoPE base.
    "gemma3_text": ArchSpec(gguf.MODEL_ARCH.GEMMA3, permute_qk=False, norm_offset=1.0, always_head_dim=True,
                            extra_metadata=lambda writer, config: _gemma3_metadata(writer, config),
                            query_scale=lambda config: gemma_query_scale(config, layers_27b=62),
                            query_scale_tensor="attn_q_norm"),
    # Mixtures of experts: each layer's experts stacked into one 3D tensor per projection
    # (ffn_gate_exps/ffn_up_exps/ffn_down_exps, [experts, rows, cols]) and the router as ffn_gate_inp.
    # Qwen3-MoE: Qwen3's attention, experts in every layer, no shared expert.
    "qwen3_moe": ArchSpec(gguf.MODEL_ARCH.QWEN3MOE, permute_qk=False,
                          extra_metadata=lambda writer, config: _moe_metadata(writer, config),
                          unsupported=lambda config: _qwen3_moe_unsupported(config)),
    # Mixtral is llama.cpp's LLAMA graph with experts (Mistral's attention, sliding window not applied).
    "mixtral": ArchSpec(gguf.MODEL_ARCH.LLAMA, permute_qk=True,
                        extra_metadata=lambda writer, config: _moe_metadata(writer, config),
                        notes="llama.cpp runs Mixtral as LLAMA with experts; sliding-window attention is not applied"),
    # gpt-oss: attention sinks and biases, experts with biases and a clamped SwiGLU, sliding-window layers
    # alternating with global ones, YaRN RoPE. The experts are written in 16 bits (or q8_0), not the MXFP4
    # OpenAI ships: llama.cpp reads either.
    "gpt_oss": ArchSpec(gguf.MODEL_ARCH.GPT_OSS, permute_qk=False, experts_in_out_interleaved=True,
                        extra_metadata=lambda writer, config: _gpt_oss_metadata(writer, config),
                        unsupported=lambda config: _gpt_oss_unsupported(config)),
}

REFUSED = {
    "gemma3": "GGUF export supports Gemma 3 text models (gemma3_text, Gemma3ForCausalLM); this one is the "
              "multimodal Gemma3ForConditionalGeneration.",
}


def expert_count(config: dict) -> int:
    """The number of experts (Qwen's num_experts; Mixtral's, and transformers 5's, num_local_experts)."""
    return int(config.get("num_experts") or config["num_local_experts"])


def _moe_metadata(writer: gguf.GGUFWriter, config: dict) -> None:
    writer.add_expert_count(expert_count(config))
    writer.add_expert_used_count(int(config["num_experts_per_tok"]))
    if config.get("moe_intermediate_size"):  # Qwen: the experts' own width (intermediate_size is a dense MLP's)
        writer.add_expert_feed_forward_length(int(config["moe_intermediate_size"]))


def _qwen3_moe_unsupported(config: dict) -> str | None:
    if config.get("mlp_only_layers") or (config.get("decoder_sparse_step") or 1) != 1:
        return ("this Qwen3-MoE model has dense MLP layers between its expert layers (mlp_only_layers / "
                "decoder_sparse_step); llama.cpp's qwen3moe graph has experts in every layer.")
    if not config.get("norm_topk_prob"):
        return ("its router does not renormalise the top-k expert weights (norm_topk_prob false); llama.cpp's "
                "qwen3moe graph always does, so the GGUF would weigh the experts differently.")
    return None


# What llama.cpp's gpt-oss graph fixes where transformers reads the config: the SwiGLU's alpha and clamp
# (ggml_swiglu_oai's arguments), and sliding-window attention on the even layers (its swa pattern of 2).
GPT_OSS_SWIGLU = {"swiglu_alpha": 1.702, "swiglu_limit": 7.0}


def _gpt_oss_unsupported(config: dict) -> str | None:
    for key, fixed in GPT_OSS_SWIGLU.items():
        if key in config and not math.isclose(float(config[key]), fixed):
            return f"its {key} is {config[key]}; llama.cpp's gpt-oss graph fixes it at {fixed}."
    if not config.get("sliding_window"):
        return "it sets no sliding window; llama.cpp's gpt-oss graph has one on every other layer from the first."
    if sliding_layers(config, 2) != [i % 2 == 0 for i in range(config["num_hidden_layers"])]:
        return ("its sliding-window layers are not every other layer from the first; llama.cpp's gpt-oss graph "
                "fixes that pattern.")
    return None


def _gpt_oss_metadata(writer: gguf.GGUFWriter, config: dict) -> None:
    _moe_metadata(writer, config)
    writer.add_expert_feed_forward_length(int(config["intermediate_size"]))  # its experts' width (no dense MLP)
    writer.add_sliding_window(int(config["sliding_window"]))


def gemma_query_scale(config: dict, *, layers_27b: int) -> float:
    """Hugging Face scales Gemma 2/3 queries by query_pre_attn_scalar ** -0.5; llama.cpp by
    1/sqrt(head_dim), or 1/sqrt(hidden // heads) for the 27B model (which it knows by its layer
    count). The ratio is folded into the query weights (1.0 for Google's own checkpoints)."""
    shape = model_shape(config)
    llama_scalar = shape.hidden // shape.n_head if shape.n_layers == layers_27b else shape.head_dim
    hf_scalar = config.get("query_pre_attn_scalar") or shape.head_dim
    return math.sqrt(llama_scalar / hf_scalar)


def sliding_layers(config: dict, default_pattern: int) -> list[bool]:
    """Which layers use sliding-window attention, from `layer_types` (transformers >= 4.53) or the
    older `sliding_window_pattern` (every n-th layer global)."""
    n_layers = config["num_hidden_layers"]
    if config.get("layer_types"):
        return [kind == "sliding_attention" for kind in config["layer_types"]]
    pattern = config.get("sliding_window_pattern") or default_pattern
    return [bool((i + 1) % pattern) for i in range(n_layers)]


def _gemma2_metadata(writer: gguf.GGUFWriter, config: dict) -> None:
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) is None:
            raise ExportError(f"This Gemma 2 model has no {key}; llama.cpp's gemma2 graph always applies it.")
    writer.add_attn_logit_softcapping(float(config["attn_logit_softcapping"]))
    writer.add_final_logit_softcapping(float(config["final_logit_softcapping"]))
    writer.add_sliding_window(int(config.get("sliding_window") or 4096))
    writer.add_sliding_window_pattern(sliding_layers(config, 2))


def _gemma3_metadata(writer: gguf.GGUFWriter, config: dict) -> None:
    if config.get("attn_logit_softcapping") is not None:
        raise ExportError("Gemma 3 with attention soft-capping is not supported by llama.cpp's gemma3 graph.")
    if config.get("final_logit_softcapping") is not None:
        writer.add_final_logit_softcapping(float(config["final_logit_softcapping"]))
    if config.get("sliding_window"):
        writer.add_sliding_window(int(config["sliding_window"]))
        writer.add_sliding_window_pattern(sliding_layers(config, 6))


def arch_for(config: dict) -> ArchSpec:
    model_type = config.get("model_type")
    spec = ARCHITECTURES.get(model_type)
    if model_type in REFUSED:
        raise ExportError(REFUSED[model_type])
    if spec is None:
        raise ExportError(
            f"GGUF export does not support the {model_type!r} architecture yet "
            f"(supported: {', '.join(sorted(ARCHITECTURES))}).")
    problem = spec.unsupported(config) if spec.unsupported else None
    if problem:
        raise ExportError(f"GGUF export cannot write this {model_type} model: {problem}")
    return spec


def rope_settings(config: dict) -> dict:
    """rope_theta and scaling from either transformers 5 (`rope_parameters`) or 4 (`rope_theta`,
    `rope_scaling`). Only the scaling types llama.cpp reads from metadata alone are accepted."""
    params = dict(config.get("rope_parameters") or {})
    local = {}
    if "full_attention" in params:  # one set per layer type (transformers 5: Gemma 3)
        local = params.get("sliding_attention") or {}
        params = dict(params["full_attention"])
    if "rope_theta" not in params and "rope_theta" in config:
        params["rope_theta"] = config["rope_theta"]
    theta_local = local.get("rope_theta", config.get("rope_local_base_freq"))
    if local.get("rope_type", "default") != "default":
        raise ExportError(f"RoPE scaling {local['rope_type']!r} on sliding-window layers is not supported "
                          "by llama.cpp.")
    scaling = config.get("rope_scaling") or {}
    params.update({k: v for k, v in scaling.items() if k not in params})
    rope_type = params.get("rope_type") or params.get("type") or "default"
    if rope_type not in ("default", "linear", "yarn", "llama3"):
        raise ExportError(f"RoPE scaling {rope_type!r} is not supported by the GGUF export yet.")
    return {"theta": float(params.get("rope_theta", 10000.0)), "type": rope_type,
            "theta_local": float(theta_local) if theta_local is not None else None,
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
