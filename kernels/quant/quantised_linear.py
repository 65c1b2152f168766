"""`QuantisedLinear`: what the frozen quantised linear layers (NF4Linear, FP8Linear) share.

Each is an `nn.Linear` (so PEFT wraps it in its ordinary LoRA layer) whose `weight` parameter holds
the quantised storage, never a dense weight: `nn.Module.__init__` instead of nn.Linear's, which
would allocate one. The layer's own forward (PEFT's plain path) runs in autocast's dtype when
autocast is on, else the input's, through the subclass's autograd function. Scratch tensors the
layers fill just before a matmul (a dequantised or transposed weight) come from `shared_buffer`:
one per (device, dtype, purpose), sized for the largest weight and reused by every layer.
"""
from __future__ import annotations

import torch
from torch import nn

_BUFFERS: dict[tuple[torch.device, torch.dtype, str], torch.Tensor] = {}


def shared_buffer(numel: int, device: torch.device, dtype: torch.dtype, purpose: str = "weight") -> torch.Tensor:
    """A flat scratch tensor of at least numel elements; the same memory for every layer."""
    key = (device, dtype, purpose)
    buffer = _BUFFERS.get(key)
    if buffer is None or buffer.numel() < numel:
        _BUFFERS.pop(key, None)  # free the smaller one before allocating
        buffer = _BUFFERS[key] = torch.empty(numel, device=device, dtype=dtype)
    return buffer[:numel]


def shared_buffers() -> list[torch.Tensor]:
    """The shared buffers now (a CUDA graph that wrote into one keeps it: memory/graphs.py)."""
    return list(_BUFFERS.values())


def release_buffers() -> None:
    """Drop the shared buffers (they come back, sized as needed, on the next use)."""
    _BUFFERS.clear()


class QuantisedLinear(nn.Linear):
    """y = x @ W^T + b over quantised storage of the frozen W. Subclasses give `dense_weight` (a new
    dense copy, for merging and export) and `_matmul` (the layer's own autograd matmul)."""

    def __init__(self, storage: torch.Tensor, shape: tuple[int, int], bias: torch.Tensor | None = None):
        nn.Module.__init__(self)
        if len(shape) != 2:
            raise ValueError(f"{type(self).__name__} needs a 2-D weight, not shape {tuple(shape)}")
        self.out_features, self.in_features = shape
        self.weight = nn.Parameter(storage, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)

    @staticmethod
    def quantise(weight: torch.Tensor, **options):
        """The subclass's storage of a dense weight (what its __init__ takes)."""
        raise NotImplementedError

    @classmethod
    def from_linear(cls, linear: nn.Linear, device=None, **options) -> QuantisedLinear:
        """Quantises `linear`'s weight on `device` (default: where it lives); the bias stays dense."""
        weight = linear.weight.detach().to(device or linear.weight.device)
        bias = None if linear.bias is None else linear.bias.detach().to(weight.device)
        return cls(cls.quantise(weight, **options), bias)

    def dense_weight(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        raise NotImplementedError

    def _matmul(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        bias = None if self.bias is None else self.bias.to(dtype)
        return self._matmul(x.to(dtype), bias)
