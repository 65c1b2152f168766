"""Our attention path inside transformers: the "lanner" attention implementation and its mask function.

transformers builds each forward's masks through the mask function registered for
`config._attn_implementation`, then hands the result to every decoder layer's attention function.
patch_model sets a patched model's implementation to "lanner" (unpatch_model restores the old one), so:

- the mask function returns an `AttentionLayout`, a description of what was asked for (the 2D padding
  mask, a packed batch's per-token sample ids, the sliding window, the offsets) instead of a dense
  (B, 1, T, T) mask. Nothing is materialised for the usual training batch;
- the attention function runs `causal_attention` on that description when it is a causal
  self-attention over the whole sequence (training, or a prefill without a cache), and otherwise
  (generation with a KV cache, attention dropout, output_attentions, a mask function it does not
  recognise) builds transformers' own dense mask from the same arguments and runs transformers' sdpa,
  or the module's eager when soft-capping or with sinks, exactly as transformers would.
"""
from __future__ import annotations

import sys

import torch
from transformers import masking_utils
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, causal_mask_function
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .core import causal_attention

ATTENTION_NAME = "lanner"
# Implementations our path replaces when patching; anything else (paged, a user's own) is left alone.
REPLACEABLE = {None, "sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3"}


def _closure(function) -> dict:
    names = function.__code__.co_freevars
    return {name: cell.cell_contents for name, cell in zip(names, function.__closure__ or ())}


def read_mask_function(function):
    """(window, segments, understood) from one of transformers' composed mask functions.

    Understood are the causal mask, its sliding-window overlay and the packed-sequence overlay, combined
    with and_masks; anything else (or_masks, block-wise overlays, custom functions) is not. Newer
    transformers (5.2x) also remap q/kv indices to per-sample positions inside a packed row, next to the
    same packed-sequence overlay: within one sample that changes nothing, so the remap is looked through.
    """
    if function is causal_mask_function:
        return None, None, True
    qualname = getattr(function, "__qualname__", "")
    if qualname.startswith("remap_positions_for_packed_sequence.") and getattr(function, "__closure__", None):
        return read_mask_function(_closure(function).get("mask_function"))
    if qualname.startswith("and_masks.") and getattr(function, "__closure__", None):
        window, segments, has_causal = None, None, False
        for part in _closure(function).get("mask_functions", ()):
            if part is causal_mask_function:
                has_causal = True
                continue
            name = getattr(part, "__qualname__", "")
            if name.startswith("sliding_window_overlay.") and window is None:
                window = _closure(part).get("sliding_window")
            elif name.startswith("packed_sequence_mask_function.") and segments is None:
                segments = _closure(part).get("packed_sequence_mask")
            else:
                inner_window, inner_segments, understood = read_mask_function(part)
                if not understood:
                    return None, None, False
                has_causal = True  # an understood and_masks part always holds the causal mask
                window = window if inner_window is None else inner_window
                segments = segments if inner_segments is None else inner_segments
        return window, segments, has_causal
    return None, None, False


class AttentionLayout:
    """What a forward's mask was asked to be, kept as a description (see the module docstring)."""

    def __init__(self, mask_kwargs: dict):
        self.mask_kwargs = mask_kwargs
        self.q_length = mask_kwargs.get("q_length")
        self.kv_length = mask_kwargs.get("kv_length")
        window, segments, understood = read_mask_function(mask_kwargs.get("mask_function", causal_mask_function))
        self.window, self.segments, self.understood = window, segments, understood
        self.block_masks: dict = {}  # FlexAttention block masks of this forward, shared by its layers
        self._padding_checked, self._padding = False, None
        self._dense: dict = {}

    @property
    def whole_sequence(self) -> bool:
        """A causal self-attention of the whole sequence from position 0 (no cache, no offsets)."""
        offsets = (self.mask_kwargs.get("q_offset", 0), self.mask_kwargs.get("kv_offset", 0))
        return (self.understood and self.q_length == self.kv_length
                and all(isinstance(o, int) and o == 0 for o in offsets))

    @property
    def padding(self) -> torch.Tensor | None:
        """The (B, T) key padding mask, or None when there is none or it keeps every token (checked once)."""
        if not self._padding_checked:
            mask = self.mask_kwargs.get("attention_mask")
            if mask is not None:
                mask = masking_utils.prepare_padding_mask(mask, self.kv_length, 0)[:, :self.kv_length].bool()
                mask = None if bool(mask.all()) else mask
            self._padding, self._padding_checked = mask, True
        return self._padding

    def dense(self, kind: str, dtype=None):
        """transformers' own mask for this call ("sdpa": boolean or None, "eager": additive float)."""
        key = (kind, dtype)
        if key not in self._dense:
            kwargs = dict(self.mask_kwargs)
            if kind == "eager":
                kwargs["dtype"] = dtype
                self._dense[key] = masking_utils.eager_mask(**kwargs)
            else:
                self._dense[key] = masking_utils.sdpa_mask(**kwargs)
        return self._dense[key]


def layout_mask(**mask_kwargs) -> AttentionLayout:
    """The "lanner" mask function: a description, not a tensor."""
    return AttentionLayout(mask_kwargs)


def _eager_forward(module):
    return getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)


def lanner_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                             sliding_window=None, softcap=None, **kwargs):
    """The "lanner" attention function: transformers' calling convention, output (B, T, H, D)."""
    layout = attention_mask if isinstance(attention_mask, AttentionLayout) else None
    sinks = kwargs.get("s_aux")  # gpt-oss's attention sinks
    # (From patching/attention.py, under the memory engine: see causal_attention.)
    kept, recomputing = kwargs.pop("kept_attention", None), kwargs.pop("recomputing", False)
    if (layout is not None and layout.whole_sequence and dropout == 0.0 and not kwargs.get("output_attentions")
            and query.shape[2] == key.shape[2] == layout.q_length and getattr(module, "is_causal", True)):
        out = causal_attention(query, key, value, scale=scaling, window=layout.window, softcap=softcap,
                               padding=layout.padding, segments=layout.segments, sinks=sinks,
                               block_mask_cache=layout.block_masks, kept=kept, recomputing=recomputing)
        return out.transpose(1, 2).contiguous(), None
    eager = _eager_forward(module)
    if (softcap is not None or sinks is not None or kwargs.get("output_attentions")) and eager is not None:
        mask = layout.dense("eager", query.dtype) if layout is not None else attention_mask
        return eager(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                     sliding_window=sliding_window, softcap=softcap, **kwargs)
    mask = layout.dense("sdpa") if layout is not None else attention_mask
    return sdpa_attention_forward(module, query, key, value, mask, dropout=dropout, scaling=scaling,
                                  sliding_window=sliding_window, softcap=softcap, **kwargs)


def register() -> None:
    """Makes "lanner" a known attention implementation (idempotent; other implementations untouched)."""
    ALL_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, lanner_attention_forward)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION_NAME, layout_mask)


_PREVIOUS = "_lanner_previous_attn_implementation"


def use_lanner_attention(model: torch.nn.Module) -> bool:
    """Switches a model to our attention (the old choice kept on the model); False when it keeps its own."""
    config = model.config
    current = getattr(config, "_attn_implementation", None)
    if current == ATTENTION_NAME:
        return True
    if current not in REPLACEABLE:
        return False
    register()
    object.__setattr__(model, _PREVIOUS, current)
    config._attn_implementation = ATTENTION_NAME
    return True


def restore_attention(model: torch.nn.Module) -> None:
    """Gives a model back the attention implementation it had before use_lanner_attention."""
    if _PREVIOUS in model.__dict__:
        model.config._attn_implementation = model.__dict__.pop(_PREVIOUS)
