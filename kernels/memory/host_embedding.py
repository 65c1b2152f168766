"""A frozen input-embedding table kept in pinned host memory and read by the GPU in place.

A LoRA step reads a handful of the table's rows (one per token: 64 MiB of 1 GiB at 8,192 tokens on
Llama-3 8B) and never writes it, yet the table takes 1 GiB of GPU memory. Here its storage moves to
pinned host memory, which the GPU can address directly (unified virtual addressing): the parameter
stays a CUDA tensor of the same shape, so `F.embedding`'s gather kernel, `model.device` and the state
dict work unchanged, and each step's rows cross the host link as the kernel reads them (about 1-2 ms
at 8,192 tokens). The caching allocator never sees that memory, so the planner's base shrinks by the
table's size.

Only for a frozen table on a CUDA device that the output head does not share: a tied head would
read all of it for every token's logits.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

logger = logging.getLogger("lanner.kernels")


class _MappedHostArray:
    """Exposes a pinned host tensor to torch as CUDA memory (__cuda_array_interface__; bf16 has no
    typestr there, so the bytes go through as int16 and are viewed back)."""

    def __init__(self, host: torch.Tensor):
        self.host = host  # kept alive for as long as the CUDA view exists
        self.__cuda_array_interface__ = {
            "shape": (host.numel() * host.element_size() // 2,),
            "typestr": "<i2",
            "data": (host.data_ptr(), False),
            "version": 2,
            "strides": None,
        }


def mapped_host_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A CUDA tensor equal to `tensor` whose storage is pinned host memory (read over the host link)."""
    if tensor.element_size() % 2:
        raise ValueError(f"mapped_host_copy: {tensor.dtype} is not a whole number of 16-bit words")
    host = tensor.detach().to("cpu").contiguous().pin_memory()
    flat = torch.as_tensor(_MappedHostArray(host), device=tensor.device)
    return flat.view(tensor.dtype).view(tensor.shape)


def is_in_host_memory(tensor: torch.Tensor) -> bool:
    """True for a parameter this module moved (its storage is pinned host memory)."""
    return tensor.is_cuda and getattr(tensor, "_lanner_host_resident", False)


def move_input_embeddings_to_host(model: nn.Module) -> int:
    """Moves the model's frozen, untied input-embedding table to pinned host memory; returns the GPU
    bytes freed (0, with a log line, when the table is not eligible)."""
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(embeddings, "weight", None)
    if weight is None or not weight.is_cuda or weight.requires_grad or is_in_host_memory(weight):
        return 0
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    head_weight = getattr(head, "weight", None)
    if head_weight is not None and head_weight.data_ptr() == weight.data_ptr():
        logger.info("lanner.kernels: the input embeddings are tied to the output head; they stay on the GPU")
        return 0
    freed = weight.numel() * weight.element_size()
    weight.data = mapped_host_copy(weight.data)
    weight._lanner_host_resident = True
    return freed
