"""Causal self-attention for training: one entry point that picks the cheapest kernel computing exactly it.

    out = causal_attention(q, k, v, scale=..., window=None, softcap=None, padding=None, segments=None, sinks=None)

q is (B, Hq, T, D), k and v (B, Hk, T, D) with Hq a multiple of Hk (GQA: k and v are never expanded).
Key j is visible to query i when all of these hold (Hugging Face's mask semantics):
    j <= i                                  causal
    i - j < window                          a sliding window (a window >= T is no window)
    segments[b, i] == segments[b, j]        packed samples (padding-free batches), ids per token
    padding[b, j]                           a 2D padding mask (True = a real token)
and with softcap the scores s = scale * q.k become softcap * tanh(s / softcap) before the softmax. With
sinks (gpt-oss: one logit per query head) every row's softmax denominator also holds exp(sink), a key whose
value is zero; they run on our Triton kernel (CUDA, no padding or packed samples) or the reference (an
extra score column, dropped after the softmax), SDPA and FlexAttention having no sink here.

Dispatch, first match wins:
  1. nothing but causality: torch SDPA with is_causal=True (flash / cuDNN / efficient kernels), no mask
     tensor, enable_gqa (at D 128 on an H100 as fast as its cuDNN kernel forced, 1.7-2.2x faster than our Triton one:
     benchmarks/attention_bench.py --sdpa-backends, docs/benchmarks.md twenty-eighth round);
  2. on CUDA with FlexAttention (torch >= 2.5): flex_attention compiled, with a block mask from the
     rules above, so fully masked key blocks are skipped (a window of W at length T costs about W/T of
     the square), and the soft-cap as a score_mod; enable_gqa;
  3. otherwise (the CPU, or no FlexAttention): the reference - a dense boolean mask and SDPA, or the
     eager softmax(softcap(q k^T)) v when soft-capping.
  Before 2, on CUDA without padding or segments, for a head dimension in TRITON_HEAD_DIMS: our Triton flash
  attention (flash.py) for the window and the soft-cap, measured faster than FlexAttention there.
backend="triton" (or LANNER_ATTENTION=triton) asks for that kernel at any head dimension it has tiles for (a power
of two from 16 to 256); with padding, or another head dimension, it has no kernel, and such a call runs what
"auto" would (FlexAttention on CUDA, else the reference). FlexAttention's compiled kernel takes no head dimension
below 16 (tl.dot's smallest), so on CUDA those run the reference, "auto" or forced; a forced path that cannot
run says so once through the lanner.kernels logger.
A query row with no visible key (a left-padding query) outputs zeros, with zero gradients, on every
path: what torch's SDPA and FlexAttention do, and so transformers' sdpa (its eager gives such a row
uniform weights instead). No real token reads that row, but with left padding the last pad
position's logits predict the first real token, so it reaches a loss whose labels keep that target.
"""
from __future__ import annotations

import functools
import logging
import os

import torch
import torch.nn.functional as F

from .flash import TILES, flash_attention
from .kept_sdpa import fused_kernel, kept_sdpa

try:  # torch >= 2.5
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # pragma: no cover - older torch
    create_block_mask = flex_attention = None

logger = logging.getLogger("lanner.kernels")

BACKENDS = ("auto", "sdpa", "flex", "reference", "triton")
# Below this head dimension inductor refuses to compile FlexAttention ("NYI: embedding dimension of the query, key,
# and value must be at least 16"): its kernel multiplies with tl.dot, which takes no smaller dimension.
FLEX_MIN_HEAD_DIM = 16
# FlexAttention's kernel_options (tile sizes, warps, stages) on CUDA by head dimension, where measurement beat
# the defaults of the torch in use (benchmarks/attention_bench.py --tune-flex); a head dimension not here keeps
# torch's own choice. D 256 (flex runs it with padding or packed samples): a 128 x 64 forward at 8 warps, Gemma
# 2's global layer at 8,192 tokens 15.6 ms forward + backward against 16.9 (forward 2.13 against 3.42); no
# backward tiles tried beat torch's (docs/benchmarks.md, sixteenth round).
FLEX_KERNEL_OPTIONS: dict[int, dict] = {256: dict(BLOCK_M=128, BLOCK_N=64, fwd_num_warps=8, fwd_num_stages=2)}
# Head dimensions where "auto" runs our Triton kernel instead of FlexAttention: D 256 (Gemma 2 and 3) on the H200,
# forward + backward at 8,192 tokens, Gemma 2's global layer 12.7 ms against 16.9 and its sliding layer (window
# 4,096) 10.9 against 12.9, and ~6 s of first-call compile against ~58 (docs/benchmarks.md, sixteenth round).
# D 128 is not measured yet.
TRITON_HEAD_DIMS = frozenset({256})


def _flex_kernel_options(q: torch.Tensor) -> dict | None:
    """FLEX_KERNEL_OPTIONS for a 16-bit CUDA call (measured there; float32 tiles of this size would not fit the
    shared memory), else None: torch's own choice."""
    return FLEX_KERNEL_OPTIONS.get(q.shape[-1]) if q.is_cuda and q.element_size() == 2 else None


def effective_window(window: int | None, length: int) -> int | None:
    """The window that masks anything at this length: key j is kept when i - j < window, so window >= T keeps all."""
    if window is None or window <= 0 or window >= length:
        return None
    return int(window)


def forced_backend() -> str:
    """LANNER_ATTENTION's path, or "auto"."""
    forced = os.environ.get("LANNER_ATTENTION", "auto")
    if forced not in BACKENDS:
        raise ValueError(f"LANNER_ATTENTION must be one of {BACKENDS}, got {forced!r}")
    return forced


def choose_backend(q: torch.Tensor, window, softcap, padding, segments) -> str:
    """Which path runs this call (module docstring); LANNER_ATTENTION=reference|flex|triton forces one."""
    forced = forced_backend()
    if window is None and softcap is None and padding is None and segments is None:
        return "sdpa"
    if forced != "auto":
        return forced if forced != "sdpa" else "reference"
    return auto_backend(q.shape[-1], q.is_cuda, padding is not None or segments is not None)


def auto_backend(head_dim: int, on_cuda: bool, masked: bool) -> str:
    """"auto"'s choice for a window or a soft-cap; masked: padding or packed segments come with it."""
    if not on_cuda:
        return "reference"
    if head_dim in TRITON_HEAD_DIMS and not masked:
        return "triton"
    return "flex" if flex_attention is not None and head_dim >= FLEX_MIN_HEAD_DIM else "reference"


def _sinks_backend(q: torch.Tensor, requested: str, padded: bool) -> str:
    """The path for a call with sinks: our Triton kernel (CUDA under "auto", or asked for; packed samples too),
    else the reference (padding, or a head dim without tiles)."""
    if padded or q.shape[-1] not in TILES:
        return "reference"
    return "triton" if requested == "triton" or (requested == "auto" and q.is_cuda) else "reference"


def call_backend(q: torch.Tensor, window, softcap, padding, segments, sinks, backend: str | None = None) -> str:
    """The path causal_attention runs for this call (window already effective_window's): `backend` or
    LANNER_ATTENTION when given, within what each path takes."""
    if sinks is not None:
        backend = _sinks_backend(q, backend or forced_backend(), padding is not None)
    backend = backend or choose_backend(q, window, softcap, padding, segments)
    head_dim = q.shape[-1]
    if backend == "triton" and padding is not None:
        backend = auto_backend(head_dim, q.is_cuda, masked=True)  # no kernel of ours for padding
    elif backend == "triton" and head_dim not in TILES:
        backend = auto_backend(head_dim, q.is_cuda, masked=True)
        _say_once(f"no Triton flash attention tiles for head dim {head_dim} (powers of two from 16 to 256); "
                  f"attention runs {backend}")
    if backend == "flex" and q.is_cuda and head_dim < FLEX_MIN_HEAD_DIM:
        backend = "reference"
        _say_once(f"FlexAttention compiles no head dim below {FLEX_MIN_HEAD_DIM} (got {head_dim}); "
                  "attention runs the reference")
    return backend


@functools.lru_cache(maxsize=None)
def _say_once(message: str) -> None:
    logger.warning("lanner.kernels: %s", message)


def causal_attention(q, k, v, *, scale: float | None = None, window: int | None = None,
                     softcap: float | None = None, padding: torch.Tensor | None = None,
                     segments: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                     block_mask_cache: dict | None = None, backend: str | None = None, kept=None,
                     recomputing: bool = False) -> torch.Tensor:
    """Causal attention with the module docstring's options; returns (B, Hq, T, D) like SDPA.

    kept: where a checkpointed layer's forward leaves its attention output for the recompute (`recomputing`) to take
    (kept_sdpa.py); used on the plain causal path where SDPA runs its flash or cuDNN kernel, and by our Triton kernel;
    ignored on the others (FlexAttention, the reference).

    block_mask_cache: where FlexAttention block masks built from padding/segments (and the Triton kernel's
    sample bounds) are kept, so that every layer (and each layer's recompute) of one step shares one; window-only
    masks are cached globally.
    """
    length = q.shape[2]
    if k.shape[2] != length:
        raise ValueError(f"causal_attention: q has {length} positions and k {k.shape[2]} (self-attention only)")
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    window = effective_window(window, length)
    softcap = float(softcap) if softcap else None
    backend = call_backend(q, window, softcap, padding, segments, sinks, backend)
    gqa = q.shape[1] != k.shape[1]
    if backend == "sdpa" and window is None and softcap is None and padding is None and segments is None:
        kernel = fused_kernel(q, k, v, scale) if kept is not None else None
        if kernel is not None:
            return kept_sdpa(q, k, v, scale, kernel, kept, recomputing)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    if backend == "triton":
        return flash_attention(q, k, v, scale, window, softcap, sinks, segments, cache=block_mask_cache, kept=kept,
                               recomputing=recomputing)
    if backend == "flex":
        compiled = q.is_cuda
        block_mask = _block_mask(q, window, padding, segments, block_mask_cache, compiled)
        attend = _compiled_flex() if compiled else flex_attention
        return attend(q, k, v, score_mod=_softcap_score_mod(softcap), block_mask=block_mask, scale=scale,
                      enable_gqa=gqa, kernel_options=_flex_kernel_options(q))
    return _reference(q, k, v, scale, dense_mask(length, window, padding, segments, q.device), softcap, sinks)


def dense_mask(length: int, window, padding, segments, device) -> torch.Tensor:
    """The (B or 1, 1, T, T) boolean mask of the rules above."""
    i = torch.arange(length, device=device)[:, None]
    j = torch.arange(length, device=device)[None, :]
    mask = j <= i
    if window is not None:
        mask = mask & (i - j < window)
    mask = mask[None, None]
    if segments is not None:
        mask = mask & (segments[:, None, :, None] == segments[:, None, None, :])
    if padding is not None:
        mask = mask & padding[:, None, None, :].bool()
    return mask


def _reference(q, k, v, scale, mask, softcap, sinks=None):
    gqa = q.shape[1] != k.shape[1]
    if softcap is None and sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    if gqa:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    seen = mask.any(dim=-1, keepdim=True)  # rows without a visible key: zeros, as SDPA and FlexAttention give
    scores = scores.masked_fill(~(mask | ~seen), float("-inf"))
    if sinks is not None:  # the sink's column, dropped after the softmax
        sink_column = sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, sink_column], dim=-1), dim=-1, dtype=torch.float32)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32)
    return torch.matmul(probs.to(q.dtype), v) * seen


# FlexAttention ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _compiled_flex():
    # One compiled callable for the process; torch.compile specialises it per shape and score/mask mod.
    # Past dynamo's recompile limit (8 by default) flex_attention silently runs unfused, materialising the
    # scores: measured on the H200, 170 ms instead of ~10 for one 8,192-token layer. A model has a few
    # variants (Gemma 2: sliding and global layers, each static then dynamic in length, with and without
    # padding), so the limit is raised, never lowered.
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    setattr(config, name, max(getattr(config, name), 64))
    return torch.compile(flex_attention)


@functools.lru_cache(maxsize=None)
def _softcap_score_mod(softcap):
    # Cached per value so that the compiled kernel sees the same function object every layer and step.
    if softcap is None:
        return None

    def softcap_score(score, b, h, q_idx, kv_idx):
        return torch.tanh(score / softcap) * softcap

    return softcap_score


def _mask_mod(window, padding, segments):
    def mask_mod(b, h, q_idx, kv_idx):
        visible = q_idx >= kv_idx
        if window is not None:
            visible = visible & (q_idx - kv_idx < window)
        if segments is not None:
            visible = visible & (segments[b, q_idx] == segments[b, kv_idx])
        if padding is not None:
            visible = visible & padding[b, kv_idx]
        return visible

    return mask_mod


_WINDOW_BLOCK_MASKS: dict = {}


def window_block_masks() -> list:
    """The window-only block masks cached now (a CUDA graph that read one keeps it: memory/graphs.py)."""
    return list(_WINDOW_BLOCK_MASKS.values())


def _block_mask(q, window, padding, segments, cache, compiled):
    length = q.shape[2]
    if padding is None and segments is None:
        key = (str(q.device), length, window, compiled)
        if key not in _WINDOW_BLOCK_MASKS:
            if len(_WINDOW_BLOCK_MASKS) >= 64:  # many distinct lengths (padded batches): keep it bounded
                _WINDOW_BLOCK_MASKS.clear()
            _WINDOW_BLOCK_MASKS[key] = create_block_mask(_mask_mod(window, None, None), None, None, length, length,
                                                         device=q.device, _compile=compiled)
        return _WINDOW_BLOCK_MASKS[key]
    key = (length, window, compiled)
    if cache is not None and key in cache:
        return cache[key]
    padding = padding.bool() if padding is not None else None
    block_mask = create_block_mask(_mask_mod(window, padding, segments), q.shape[0], None, length, length,
                                   device=q.device, _compile=compiled)
    if cache is not None:
        cache[key] = block_mask
    return block_mask
