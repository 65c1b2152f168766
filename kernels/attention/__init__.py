"""Our attention path: causal SDPA without a mask when it can, FlexAttention block masks for sliding windows,
soft-capping, packed and padded batches, and transformers' own path where it must (docs/kernels.md)."""
from .core import causal_attention, choose_backend, dense_mask, effective_window

__all__ = ["causal_attention", "choose_backend", "dense_mask", "effective_window"]
