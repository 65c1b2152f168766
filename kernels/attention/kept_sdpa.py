"""SDPA's fused kernels (flash, cuDNN) called directly, so that a layer's recompute can take its forward's attention
output instead of computing it again.

The memory engine recomputes checkpointed layers in backward; the attention backward needs q, k, v (recomputed
cheaply), the output and the log-sum-exp of the softmax rows. Where the engine keeps the last two from the forward
(memory/graphs.py, in host memory beside the layer's input), the recompute skips the attention forward: a fifth of
the attention's time a step (~0.3 ms a layer at 8,192 tokens of the 8B shape). `kept` is that store:

    kept.store(out, lse, extras)    in the forward: what the backward will need (extras: the kernel's other outputs)
    kept.take() -> (out, lse, extras) or None    in the recompute: the forward's, or None to compute them here

Only where SDPA itself would run one of these kernels (torch._fused_sdp_choice), with the arguments SDPA gives it,
so the numbers are the ones F.scaled_dot_product_attention gives, on CUDA (flash or cuDNN, whichever torch prefers
there: cuDNN on the H100 with torch 2.11) as on the CPU (SDPA's flash kernel for the CPU). Our Triton kernel
(flash.py: windows and soft-capping at head dim 256) takes the same `kept`.
"""
from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

logger = logging.getLogger("lanner.kernels")
_aten = torch.ops.aten
_BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
_KERNELS = {int(backend): kernel for kernel, backend in _BACKENDS.items()}


def fused_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> str | None:
    """"flash" or "cudnn" where causal SDPA without a mask runs that kernel on these tensors, on a head dimension it
    takes unpadded (SDPA pads others to a multiple of 8 around the kernel), and the direct calls work (_works); else
    None."""
    if q.shape[-1] % 8:
        return None
    choice = torch._fused_sdp_choice(q, k, v, None, 0.0, True, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    kernel = _KERNELS.get(int(choice))
    if kernel is None or not _works(kernel, q.device, q.dtype, q.shape[-1], q.shape[1] // k.shape[1]):
        return None
    return kernel


@functools.lru_cache(maxsize=None)
def _works(kernel: str, device: torch.device, dtype: torch.dtype, head_dim: int, groups: int) -> bool:
    """Whether a small causal attention through the direct calls gives, forward and backward, what SDPA gives on the
    same kernel. The aten functions and their arguments are torch's internals, which a torch version may change
    (this path was written against 2.11-2.13); where they do, the attention is recomputed as before, said once.
    Checked before any CUDA graph is captured: the memory engine's measuring forward asks first."""
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return False
    generator = torch.Generator(device).manual_seed(0)
    q, k, v = (torch.randn(2, heads, 96, head_dim, generator=generator, device=device, dtype=dtype)
               for heads in (groups, 1, 1))
    grad = torch.randn(2, groups, 96, head_dim, generator=generator, device=device, dtype=dtype)
    try:
        # (Its own saved tensors: not the memory engine's measuring forward's, whose hooks count what a layer saves.)
        with torch.enable_grad(), torch.autocast(device.type, enabled=False), \
                torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out = kept_sdpa(*leaves, 0.125, kernel, _Unkept(), recomputing=False)
            got = (out, *torch.autograd.grad(out, leaves, grad))
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            with sdpa_kernel([_BACKENDS[kernel]]):
                out = F.scaled_dot_product_attention(*leaves, is_causal=True, scale=0.125, enable_gqa=groups > 1)
            wanted = (out, *torch.autograd.grad(out, leaves, grad))
        same = all(a.shape == b.shape and torch.allclose(a.float(), b.float(), rtol=0.02, atol=0.02)
                   for a, b in zip(got, wanted))
        reason = "" if same else "results differ from SDPA's"
    except RuntimeError as error:  # (an aten function that takes other arguments)
        same, reason = False, f"{type(error).__name__}: {str(error)[:200]}"
    if not same:
        logger.warning("lanner.kernels: SDPA's %s kernel called directly does not work with this torch (%s); "
                       "recomputed layers recompute their attention", kernel, reason)
    return same


class _Unkept:
    def store(self, out, lse, extras) -> None:
        pass

    def take(self):
        return None


def _forward(q, k, v, scale, kernel):
    if kernel == "cudnn":
        out, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = _aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, True, False, scale=scale)
        return out, lse, (seed, offset, cum_q, cum_k, max_q, max_k)
    if q.is_cuda:
        out, lse, *extras = _aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)
        return out, lse, tuple(extras[:6])  # (cum_seq_q, cum_seq_k, max_q, max_k, philox seed, philox offset)
    out, lse = _aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
    return out, lse, ()


def _backward(grad_out, q, k, v, out, lse, extras, scale, kernel):
    if grad_out.stride(-1) != 1:
        grad_out = grad_out.contiguous()
    if kernel == "cudnn":
        seed, offset, cum_q, cum_k, max_q, max_k = extras
        return _aten._scaled_dot_product_cudnn_attention_backward(grad_out, q, k, v, out, lse, seed, offset, None,
                                                                  cum_q, cum_k, max_q, max_k, 0.0, True, scale=scale)
    if q.is_cuda:
        cum_q, cum_k, max_q, max_k, seed, offset = extras
        return _aten._scaled_dot_product_flash_attention_backward(grad_out, q, k, v, out, lse, cum_q, cum_k, max_q,
                                                                  max_k, 0.0, True, seed, offset, scale=scale)
    return _aten._scaled_dot_product_flash_attention_for_cpu_backward(grad_out, q, k, v, out, lse, 0.0, True,
                                                                      scale=scale)


def stored_or_computed(kept, recomputing: bool, compute) -> tuple:
    """(output, log-sum-exp, extras): in a recompute, the forward's from `kept` where it has them; else compute()'s,
    which a forward stores in `kept` (None: no store)."""
    stored = kept.take() if kept is not None and recomputing else None
    if stored is not None:
        return stored
    out, lse, extras = compute()
    if kept is not None and not recomputing:
        kept.store(out, lse, extras)
    return out, lse, extras


class _KeptSDPA(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, scale, kernel, kept, recomputing):
        out, lse, extras = stored_or_computed(kept, recomputing, lambda: _forward(q, k, v, scale, kernel))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.extras, ctx.scale, ctx.kernel = extras, scale, kernel
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(grad_out, q, k, v, out, lse, ctx.extras, ctx.scale, ctx.kernel)
        return dq, dk, dv, None, None, None, None


def kept_sdpa(q, k, v, scale: float, kernel: str, kept, recomputing: bool) -> torch.Tensor:
    """Causal attention (B, Hq, T, D), as F.scaled_dot_product_attention(is_causal=True, enable_gqa=...) gives it
    where fused_kernel says `kernel`; its output and log-sum-exp stored in `kept` in a forward, taken from it in a
    recompute."""
    return _KeptSDPA.apply(q, k, v, scale, kernel, kept, recomputing)
