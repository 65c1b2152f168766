"""`NF4Linear`: a frozen linear layer whose weight is stored in NF4 and dequantised on every use.

It is an `nn.Linear` (so PEFT wraps it in its ordinary LoRA layer) whose `weight` parameter holds
the packed codes, as bitsandbytes' Linear4bit does, and whose state dict is bitsandbytes'. Its
dense weight is never kept: the LoRA kernels read it through `base_weight`, which dequantises into
one buffer per (device, dtype) reused by every layer, just before each base matmul in forward and
again in backward; the layer's own forward (PEFT's plain path) does the same through
`NF4LinearFunction`.
"""
from __future__ import annotations

import torch
from torch import nn

from ..lora import register_base_weight
from .quantised_linear import QuantisedLinear, shared_buffer
from .nf4 import BNB_STATE_KEYS, NF4Weight, dequantize, from_bnb_state, quantize_nf4, to_bnb_state

class NF4Linear(QuantisedLinear):
    """y = x @ dequantise(W)^T + b with W in NF4 (bitsandbytes' storage); W is frozen."""

    def __init__(self, nf4: NF4Weight, bias: torch.Tensor | None = None):
        super().__init__(nf4.packed, tuple(nf4.shape), bias)
        self._nf4 = nf4

    @property
    def nf4(self) -> NF4Weight:
        """The storage; its codes are always the `weight` parameter's (after a copy, a load or a move too)."""
        self._nf4 = self._nf4.over(self.weight.data)
        return self._nf4

    quantise = staticmethod(quantize_nf4)  # options: double_quant (default True)

    @property
    def compute_dtype(self) -> torch.dtype:
        return self.nf4.dtype

    def dense_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A new dense copy of the weight (for merging and export; training reads the shared buffer)."""
        return dequantize(self.nf4, dtype)

    def shared_dense_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The dense weight in the shared buffer: valid only until the next layer dequantises."""
        nf4 = self.nf4
        dtype = dtype or nf4.dtype
        return dequantize(nf4, dtype, out=shared_buffer(nf4.numel(), nf4.device, dtype))

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return NF4LinearFunction.apply(x, self, bias)

    def _apply(self, fn, recurse=True):
        # The codes are a parameter and move with the module; the statistics (not parameters, so
        # that a cast of the module to another dtype leaves them float32) follow them here.
        super()._apply(fn, recurse)
        self.nf4  # noqa: B018  (moves the statistics to the codes' device)
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for key, tensor in to_bnb_state(self.nf4).items():
            destination[f"{prefix}weight.{key}"] = tensor

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        stats = {key: state_dict.pop(f"{prefix}weight.{key}") for key in BNB_STATE_KEYS
                 if f"{prefix}weight.{key}" in state_dict}
        packed = state_dict.get(f"{prefix}weight")
        if packed is not None and stats:
            nf4 = from_bnb_state(packed, stats).to(self.weight.device if self.weight.device.type != "meta"
                                                   else packed.device)
            if tuple(nf4.shape) != (self.out_features, self.in_features):
                error_msgs.append(f"{prefix}weight: NF4 shape {tuple(nf4.shape)} does not match this layer's "
                                  f"{(self.out_features, self.in_features)}")
                return
            self._nf4 = nf4
            state_dict[f"{prefix}weight"] = nf4.packed
            self.weight = nn.Parameter(nf4.packed, requires_grad=False)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)


class NF4LinearFunction(torch.autograd.Function):
    """The layer's own matmul: dequantise into the shared buffer in forward and again in backward."""

    @staticmethod
    def forward(ctx, x, layer, bias):
        ctx.layer, ctx.has_bias = layer, bias is not None
        weight = layer.shared_dense_weight(x.dtype)
        out = x @ weight.t()
        return out if bias is None else out.add_(bias)

    @staticmethod
    def backward(ctx, dout):
        dx = dout @ ctx.layer.shared_dense_weight(dout.dtype) if ctx.needs_input_grad[0] else None
        dbias = dout.reshape(-1, dout.shape[-1]).sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, None, dbias


register_base_weight(NF4Linear, NF4Linear.shared_dense_weight)
