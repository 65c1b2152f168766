"""Grouped LoRA GEMMs on torch._grouped_mm: the mixture-of-experts path on Hopper and Blackwell GPUs.

The same products as ops/grouped_lora.py, for rows sorted by expert (expert e owns rows up to
offs[e], the int32 cumulative row ends),
    Y = X_e W_e^T + s * (X_e A_e^T) B_e^T           (forward; XA = X_e A_e^T kept for backward)
    dX = dY_e W_e + s * (dY_e B_e) A_e               (backward; dY B kept for dA)
as three grouped GEMMs each: the frozen weight's, then the two rank-r ones, the rank-r term added
into Y in place. On sm90/sm100 with bf16 operands torch._grouped_mm runs CUTLASS's grouped GEMM
(TMA, wgmma, persistent tiles), where the one Triton kernel, fixed 64x64x64 tiles, measured 1.7x
slower per Qwen3-30B-A3B layer on an H200. The LoRA factors' own gradients stay on the Triton
reductions (grouped_lora_factor_grads): they are small (r x in per expert), and grouped_mm's ragged-K
form (2D x 2D) writes bf16 only on its fast path, which would round the float32 factors' gradients.

torch._grouped_mm needs both operands in one dtype, a unit stride in each matrix's last two dims and
every other stride (and the data pointer) a multiple of 16 bytes. The activations here are fresh
row-major tensors, so that is a rule on the feature dims and the frozen weights; the LoRA factors are
copied per call into padded row-major tensors of the compute dtype (r rounded up to 16 bytes with
zero ranks), which costs E * r * (in + out) elements.
"""
from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger("lanner.kernels")

# None: torch._grouped_mm on CUDA devices where it reaches CUTLASS (compute capability 9.x or 10.x, bf16),
# the Triton kernels elsewhere. True: on those devices and on the CPU (bf16 or float32; the tests compare
# both paths there). False: the Triton kernels always.
ENABLED: bool | None = None

_ALIGN_BYTES = 16


def _cutlass_device(device: torch.device) -> bool:
    # On other GPUs torch._grouped_mm loops over the groups with a device-to-host sync: Triton is faster.
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.get_device_capability(index)[0] in (9, 10) and grouped_mm_works(f"cuda:{index}")


@functools.cache
def grouped_mm_works(device: str) -> bool:
    """Once per device, torch._grouped_mm on both weight layouts used here, on a tiny bf16 case with an
    empty group: a torch build whose grouped GEMM refuses or miscomputes them leaves the experts on
    Triton, with a warning in words."""
    generator = torch.Generator(device).manual_seed(0)  # the caller's random streams stay untouched
    x = torch.randn(24, 16, device=device, generator=generator).bfloat16()
    w = torch.randn(3, 16, 16, device=device, generator=generator).bfloat16()
    offs = torch.tensor([8, 8, 24], device=device, dtype=torch.int32)
    expected = torch.cat([x[:8] @ w[0].t(), x[8:] @ w[2].t()]).float()
    try:
        ok = all(torch.allclose(torch._grouped_mm(x, b, offs=offs).float(), expected, rtol=2e-2, atol=2e-1)
                 for b in (w.transpose(1, 2), w.transpose(1, 2).contiguous()))
        reason = "wrong results"
    except RuntimeError as error:
        ok, reason = False, str(error)
    if not ok:
        log.warning("lanner.kernels: MoE experts on the Triton kernels: torch._grouped_mm failed its check on %s (%s)",
                    device, reason)
    return ok


def _dtype_ok(device: torch.device, dtype: torch.dtype) -> bool:
    # CUDA: only bf16 (in and out) reaches CUTLASS. The CPU kernel also takes float32, whose exact
    # products let the tests hold this path to the float32 bound.
    return dtype == torch.bfloat16 or (device.type == "cpu" and dtype == torch.float32)


def _aligned(t: torch.Tensor) -> bool:
    """A unit stride in the last two dims, the other strides and the data pointer on 16 bytes."""
    align = _ALIGN_BYTES // t.element_size()
    strides = list(t.stride())
    if 1 not in strides[-2:] or t.data_ptr() % _ALIGN_BYTES:
        return False
    strides.pop(len(strides) - 2 + strides[-2:].index(1))
    return all(s % align == 0 for s in strides)


def use_grouped_mm(x: torch.Tensor, *weights: torch.Tensor) -> bool:
    """Whether the grouped GEMMs of rows x (and of the activations derived from them, row-major with the
    weights' feature dims) over the frozen weights [E, out, in] can run on torch._grouped_mm; else the
    Triton kernels. Chosen once per experts call, before anything runs, so it never fails half-way."""
    if ENABLED is False or not hasattr(torch, "_grouped_mm") or x.shape[0] == 0:
        return False
    if x.device.type == "cuda":
        if not _cutlass_device(x.device):
            return False
    elif not (ENABLED and x.device.type == "cpu" and grouped_mm_works("cpu")):
        return False
    if not _dtype_ok(x.device, x.dtype) or not _aligned(x):
        return False
    align = _ALIGN_BYTES // x.element_size()
    return all(w.dtype == x.dtype and w.device == x.device and _aligned(w)
               and w.shape[1] % align == 0 and w.shape[2] % align == 0 for w in weights)


def _padded_factors(lora_A: torch.Tensor, lora_B: torch.Tensor, dtype: torch.dtype):
    """lora_A [E, r, in] and lora_B [E, out, r] (any strides and dtype) as row-major dtype copies
    [E, r', in] and [E, out, r'], r' = r rounded up to 16 bytes, the extra ranks zero."""
    experts, rank, _ = lora_A.shape
    align = _ALIGN_BYTES // torch.empty((), dtype=dtype).element_size()
    padded = -(-rank // align) * align
    a = lora_A.new_zeros((experts, padded, lora_A.shape[2]), dtype=dtype)
    a[:, :rank] = lora_A
    b = lora_B.new_zeros((experts, lora_B.shape[1], padded), dtype=dtype)
    b[:, :, :rank] = lora_B
    return a, b


def grouped_mm_lora_forward(x, offs, weight, lora_A, lora_B, scaling):
    """(Y, XA) as grouped_lora_forward's, for offs the int32 cumulative row ends per expert."""
    y = torch._grouped_mm(x, weight.transpose(1, 2), offs=offs)
    if lora_A is None:
        return y, None
    a, b = _padded_factors(lora_A, lora_B, x.dtype)
    xa = torch._grouped_mm(x, a.transpose(1, 2), offs=offs)
    y.add_(torch._grouped_mm(xa, b.transpose(1, 2), offs=offs), alpha=scaling)
    return y, xa[:, :lora_A.shape[1]]


def grouped_mm_lora_input_grad(dy, offs, weight, lora_A, lora_B, scaling):
    """(dX, dY B) as grouped_lora_input_grad's."""
    dx = torch._grouped_mm(dy, weight, offs=offs)
    if lora_A is None:
        return dx, None
    a, b = _padded_factors(lora_A, lora_B, dy.dtype)
    dyb = torch._grouped_mm(dy, b, offs=offs)
    dx.add_(torch._grouped_mm(dyb, a, offs=offs), alpha=scaling)
    return dx, dyb[:, :lora_A.shape[1]]
