"""RMSNorm modules on the rms_norm kernel; those that feed FP8 projections also quantise their output for them."""
from torch import nn

from ..ops.rmsnorm import rms_norm
from ..quant.fp8 import FP8Linear, offer_quantised
from .binding import bind_forward


def _rms_norm_forward(module: nn.Module, hidden_states, *, offset: float, cast_before_weight: bool, codes_to=None,
                      pass_input: bool = False):
    """pass_input: (output, a view of the input for its other use), rms_norm's (patching/layers.py)."""
    return rms_norm(hidden_states, module.weight, module._lanner_eps, offset=offset,
                    cast_before_weight=cast_before_weight, codes_to=codes_to, pass_input=pass_input)


def is_rms_norm(module: nn.Module) -> bool:
    has_eps = hasattr(module, "variance_epsilon") or hasattr(module, "eps")
    return type(module).__name__.endswith("RMSNorm") and has_eps and isinstance(getattr(module, "weight", None), nn.Parameter)


def patch_rms_norm(module: nn.Module, offset: float, cast_before_weight: bool, quantise_for_fp8: bool = False) -> None:
    """quantise_for_fp8: the output is quantised in the norm's own pass and offered to the FP8 products that
    read it next (fp8.offer_quantised), instead of by the first of them in a pass of its own."""
    eps = module.variance_epsilon if hasattr(module, "variance_epsilon") else module.eps
    object.__setattr__(module, "_lanner_eps", float(eps))
    bind_forward(module, _rms_norm_forward, offset=offset, cast_before_weight=cast_before_weight,
                 codes_to=offer_quantised if quantise_for_fp8 else None)


def _is_fp8(projection) -> bool:
    return isinstance(getattr(projection, "base_layer", projection), FP8Linear)  # PEFT's wrapper or the layer


def norms_feeding_fp8(layer: nn.Module) -> list[nn.Module]:
    """The RMSNorms of a decoder layer whose outputs an FP8 projection reads first: the input norm (q/k/v, or
    Phi-3's qkv), and the MLP's (Gemma 2/3's pre-feedforward norm, the post-attention one elsewhere) unless the
    MLP is a mixture of experts (its router reads the rows in 16 bits, its experts are not FP8)."""
    attention, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    pairs = [(getattr(layer, "input_layernorm", None),
              getattr(attention, "q_proj", None) or getattr(attention, "qkv_proj", None))]
    if mlp is not None and not hasattr(mlp, "experts"):
        mlp_norm = getattr(layer, "pre_feedforward_layernorm", None) or getattr(layer, "post_attention_layernorm", None)
        pairs.append((mlp_norm, getattr(mlp, "gate_proj", None) or getattr(mlp, "gate_up_proj", None)))
    return [norm for norm, projection in pairs if norm is not None and is_rms_norm(norm) and _is_fp8(projection)]
