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
    # The tensors llama.cpp's graph reads a bias for (GGUF names without "blk.N." and ".bias"); a checkpoint with
    # any other bias (attention_bias / mlp_bias on a graph without them) is refused, not written for a loader
    # that rejects the file.
    biases: frozenset[str] = frozenset()
    # The MLP activations llama.cpp's graph computes, as the config names them under activation_key (the key
    # transformers' model reads); None: not checked.
    activations: tuple[str, ...] | None = ("silu", "swish")
    activation_key: str = "hidden_act"
    # llama.cpp applies the config's sliding window in this graph. Where it does not, a window shorter than
    # max_position_embeddings caps the context length written: within it the window changes nothing.
    applies_sliding_window: bool = False
    # llama.cpp sizes this graph's q/k/v projections hidden x hidden: head_dim must be hidden / heads.
    head_dim_fixed: bool = False
    # The graph needs output.weight even when the embeddings are tied (then written as a copy of token_embd).
    output_required: bool = False
    # The graph reads the per-frequency `rope_freqs` divisors (Llama 3 RoPE, a YaRN ramp llama.cpp's own
    # parameters cannot express).
    reads_rope_freqs: bool = False
    notes: str = ""

    @property
    def name(self) -> str:
        return gguf.MODEL_ARCH_NAMES[self.arch]


LLAMA_BIASES = frozenset({"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"})
GELU_TANH = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast")  # the tanh approximation llama.cpp's GELU computes

ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": ArchSpec(gguf.MODEL_ARCH.LLAMA, permute_qk=True, biases=LLAMA_BIASES, reads_rope_freqs=True),
    # Mistral 7B is the Llama graph in llama.cpp (its sliding window is not applied there: the window caps the
    # context length written).
    "mistral": ArchSpec(gguf.MODEL_ARCH.LLAMA, permute_qk=True, biases=LLAMA_BIASES, reads_rope_freqs=True,
                        notes="llama.cpp runs Mistral as LLAMA; sliding-window attention is not applied, so a window "
                              "caps the context length"),
    "qwen2": ArchSpec(gguf.MODEL_ARCH.QWEN2, permute_qk=False, biases=frozenset({"attn_q", "attn_k", "attn_v"}),
                      head_dim_fixed=True),
    # Gemma 1: NeoX rope, norms stored as w - 1, embeddings scaled by sqrt(hidden) inside llama.cpp.
    # (transformers reads Gemma 1's legacy hidden_act "gelu" as the tanh approximation too)
    "gemma": ArchSpec(gguf.MODEL_ARCH.GEMMA, permute_qk=False, norm_offset=1.0, always_head_dim=True,
                      activations=(*GELU_TANH, "gelu")),
    "qwen3": ArchSpec(gguf.MODEL_ARCH.QWEN3, permute_qk=False),
    # Gemma 2: Gemma 1 plus post-attention/post-FFN norms, attention and final logit soft-capping,
    # sliding-window attention on every other layer.
    "gemma2": ArchSpec(gguf.MODEL_ARCH.GEMMA2, permute_qk=False, norm_offset=1.0, always_head_dim=True,
                       activations=GELU_TANH, activation_key="hidden_activation", applies_sliding_window=True,
                       extra_metadata=lambda writer, config: _gemma2_metadata(writer, config),
                       query_scale=lambda config: gemma_query_scale(config, layers_27b=46),
                       query_scale_tensor="attn_q", unsupported=lambda config: _gemma2_unsupported(config)),
    # Gemma 3 (text; Gemma3ForCausalLM): Gemma 2's norms plus q/k norms, no attention soft-capping,
    # 5 sliding-window layers to 1 global one, each kind with its own RoPE base.
    "gemma3_text": ArchSpec(gguf.MODEL_ARCH.GEMMA3, permute_qk=False, norm_offset=1.0, always_head_dim=True,
                            activations=GELU_TANH, activation_key="hidden_activation", applies_sliding_window=True,
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
    "mixtral": ArchSpec(gguf.MODEL_ARCH.LLAMA, permute_qk=True, reads_rope_freqs=True,
                        extra_metadata=lambda writer, config: _moe_metadata(writer, config),
                        notes="llama.cpp runs Mixtral as LLAMA with experts; sliding-window attention is not applied, "
                              "so a window caps the context length"),
    # gpt-oss: attention sinks and biases, experts with biases and a clamped SwiGLU, sliding-window layers
    # alternating with global ones, YaRN RoPE. The experts are written in 16 bits (or q8_0), not the MXFP4
    # OpenAI ships: llama.cpp reads either.
    "gpt_oss": ArchSpec(gguf.MODEL_ARCH.GPT_OSS, permute_qk=False, experts_in_out_interleaved=True,
                        biases=frozenset({"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate_inp", "ffn_gate_exps",
                                          "ffn_up_exps", "ffn_down_exps"}),
                        activations=None,  # its own clamped SwiGLU (swiglu_alpha / swiglu_limit, checked below)
                        applies_sliding_window=True, output_required=True,
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


def _gemma2_unsupported(config: dict) -> str | None:
    if config.get("sliding_window") and not any(sliding_layers(config, 2)):
        return ("none of its layers uses sliding-window attention; llama.cpp's gemma2 graph needs at least one "
                "(it stops the loading process on such a file).")
    return None


def _gemma2_metadata(writer: gguf.GGUFWriter, config: dict) -> None:
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) is None:
            raise ExportError(f"This Gemma 2 model has no {key}; llama.cpp's gemma2 graph always applies it.")
    writer.add_attn_logit_softcapping(float(config["attn_logit_softcapping"]))
    writer.add_final_logit_softcapping(float(config["final_logit_softcapping"]))
    writer.add_sliding_window(int(config.get("sliding_window") or 4096))
    writer.add_sliding_window_pattern(sliding_layers(config, 2))


def _gemma3_metadata(writer: gguf.GGUFWriter, config: dict) -> None:
    # (a config's attn_logit_softcapping is left out: transformers' Gemma 3 attention never applies it either)
    if config.get("final_logit_softcapping") is not None:
        writer.add_final_logit_softcapping(float(config["final_logit_softcapping"]))
    if config.get("sliding_window") and any(sliding_layers(config, 6)):
        # (a window with no sliding layer is left out: llama.cpp's gemma3 graph, given one, stops the process)
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
    problem = (spec.unsupported(config) if spec.unsupported else None) or _graph_mismatch(spec, config)
    if problem:
        raise ExportError(f"GGUF export cannot write this {model_type} model: {problem}")
    return spec


def _graph_mismatch(spec: ArchSpec, config: dict) -> str | None:
    """What of the config llama.cpp's graph for spec computes differently (None: nothing)."""
    activation = config.get(spec.activation_key)
    if spec.activations is not None and activation is not None and activation not in spec.activations:
        return (f"its MLP activation is {activation!r}; llama.cpp's {spec.name} graph computes "
                f"{spec.activations[0]!r}.")
    shape = model_shape(config)
    if spec.head_dim_fixed and shape.head_dim * shape.n_head != shape.hidden:
        return (f"its head_dim ({shape.head_dim}) x heads ({shape.n_head}) is not its hidden size ({shape.hidden}); "
                f"llama.cpp's {spec.name} graph sizes the attention projections hidden x hidden.")
    tied = bool(config.get("tie_word_embeddings"))
    if not tied and gguf.MODEL_TENSOR.OUTPUT not in gguf.MODEL_TENSORS[spec.arch]:
        return (f"its output layer (lm_head) is not tied to the input embeddings (tie_word_embeddings false); "
                f"llama.cpp's {spec.name} graph always uses the embeddings as the output layer.")
    return _yarn_mismatch(spec, config)


def sliding_window_in_effect(config: dict) -> int | None:
    """The sliding window Hugging Face applies on at least one layer (None: every layer attends to all)."""
    window = config.get("sliding_window")
    if not window:
        return None
    if config.get("layer_types"):
        return int(window) if "sliding_attention" in config["layer_types"] else None
    if config.get("use_sliding_window") is False:  # Qwen2/Qwen3 before layer_types: the window is off
        return None
    return int(window)


def context_length(spec: ArchSpec, config: dict) -> int:
    """The context length written: max_position_embeddings, or a shorter sliding window that llama.cpp's graph
    does not apply (within the window, attending to everything is the same as the window)."""
    length = config.get("max_position_embeddings")
    if length is None:
        raise ExportError("config.json lacks max_position_embeddings, needed for the GGUF metadata")
    window = None if spec.applies_sliding_window else sliding_window_in_effect(config)
    return min(int(length), window) if window else int(length)


def rope_settings(config: dict) -> dict:
    """rope_theta and scaling from either transformers 5 (`rope_parameters`) or 4 (`rope_theta`,
    `rope_scaling`). Only the scaling types llama.cpp reads from metadata alone are accepted."""
    params = dict(config.get("rope_parameters") or {})
    local = {}
    layered = "full_attention" in params or config.get("rope_local_base_freq") is not None
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
    if float(params.get("partial_rotary_factor") or config.get("partial_rotary_factor") or 1.0) != 1.0:
        raise ExportError("RoPE on part of each head (partial_rotary_factor) is not supported by the GGUF export.")
    original = params.get("original_max_position_embeddings")
    factor = params.get("factor")
    if rope_type == "yarn":  # transformers' defaults (_compute_yarn_parameters)
        original = original or config.get("max_position_embeddings")
        if factor is None:
            factor = float(config["max_position_embeddings"]) / float(original)
    if rope_type in ("linear", "yarn") and not factor:
        raise ExportError(f"RoPE scaling {rope_type!r} without a factor cannot be written.")
    return {"theta": float(params.get("rope_theta", 10000.0)), "type": rope_type,
            "theta_local": float(theta_local) if theta_local is not None else None, "per_layer_type": layered,
            "factor": factor, "low_freq_factor": params.get("low_freq_factor", 1.0),
            "high_freq_factor": params.get("high_freq_factor", 4.0),
            "original_max_position_embeddings": original,
            "beta_fast": float(params.get("beta_fast") or 32.0), "beta_slow": float(params.get("beta_slow") or 1.0),
            "truncate": params.get("truncate", True), "attention_factor": params.get("attention_factor"),
            "mscale": params.get("mscale"), "mscale_all_dim": params.get("mscale_all_dim")}


def yarn_attention_factor(rope: dict) -> float:
    """The factor Hugging Face multiplies YaRN's cos/sin by (_compute_yarn_parameters)."""
    factor = float(rope["factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope["attention_factor"] is not None:
        return float(rope["attention_factor"])
    if rope["mscale"] and rope["mscale_all_dim"]:
        return mscale(factor, rope["mscale"]) / mscale(factor, rope["mscale_all_dim"])
    return mscale(factor)


def yarn_attn_factor(rope: dict) -> float:
    """rope.scaling.attn_factor for a YaRN model: llama.cpp multiplies cos/sin by it x (1 + 0.1 ln factor), Hugging
    Face by its attention_factor (by default that same 1 + 0.1 ln factor; or set, or from mscale / mscale_all_dim)."""
    return yarn_attention_factor(rope) / (1 + 0.1 * math.log(float(rope["factor"])))


def _yarn_mismatch(spec: ArchSpec, config: dict) -> str | None:
    """What of a YaRN config llama.cpp's graph for spec cannot reproduce (None: all of it)."""
    rope = rope_settings(config)
    if rope["type"] != "yarn":
        return None
    if rope["per_layer_type"] and not math.isclose(yarn_attn_factor(rope), 1.0, rel_tol=1e-7):
        return (f"its YaRN attention factor ({yarn_attention_factor(rope):g}) is not the default one for its factor, "
                f"and llama.cpp's {spec.name} graph, with its sliding-window layers on their own RoPE, does not apply "
                "such a factor as transformers does.")
    # The ramp's ends not truncated to whole dimensions (gpt-oss's `truncate: false`) moves them by less than a
    # dimension: written as llama.cpp's own converter writes such a model, and the export's logit check judges it.
    as_llama_cpp_truncates = {**rope, "truncate": True}
    if not spec.reads_rope_freqs and yarn_rope_divisors(as_llama_cpp_truncates, model_shape(config).head_dim) is not None:
        return (f"its YaRN RoPE ramp (beta_fast {rope['beta_fast']:g}, beta_slow {rope['beta_slow']:g}) is not the one "
                f"llama.cpp computes (32, 1), and llama.cpp's "
                f"{spec.name} graph reads no per-frequency correction: positions would rotate differently.")
    return None


def yarn_rope_divisors(rope: dict, rope_dim: int) -> np.ndarray | None:
    """Per-frequency divisors (llama.cpp's rope_freqs) that turn llama.cpp's YaRN frequencies into Hugging Face's
    where the two differ: llama.cpp always truncates the ramp's ends to whole dimensions and uses beta_fast 32 /
    beta_slow 1, transformers takes the config's betas and `truncate`. None where they agree."""
    base, factor, original = rope["theta"], float(rope["factor"]), float(rope["original_max_position_embeddings"])

    def corr_dim(rotations: float) -> float:
        return rope_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    def extrapolation_weights(beta_fast: float, beta_slow: float, truncate: bool) -> np.ndarray:
        low, high = corr_dim(beta_fast), corr_dim(beta_slow)
        if truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, rope_dim - 1)
        if low == high:
            high += 0.001
        ramp = np.clip((np.arange(rope_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        return 1 - ramp

    scale = 1.0 / factor  # llama.cpp's freq_scale: the interpolated frequencies' share
    hf = extrapolation_weights(rope["beta_fast"], rope["beta_slow"], bool(rope["truncate"]))
    llama = extrapolation_weights(32.0, 1.0, True)
    divisors = (scale + (1 - scale) * llama) / (scale + (1 - scale) * hf)
    return None if np.allclose(divisors, 1.0, rtol=0, atol=1e-7) else divisors.astype(np.float32)


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
