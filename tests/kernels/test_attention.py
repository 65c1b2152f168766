"""Our attention path against transformers' eager attention, float32, forward and backward, per variant;
then whole models of each layout (window, packed, padded) against plain HF + PEFT on eager attention."""
import pytest
import torch
from torch import nn
from transformers import masking_utils
from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

from lanner.kernels.attention import causal_attention, choose_backend, core, effective_window, kept_sdpa
from lanner.kernels.attention.transformers_glue import ATTENTION_NAME
from lora_twins import lora_grads, max_relative_error, token_batches, twins

B, HQ, HK, T, D = 2, 4, 2, 7, 8  # GQA throughout: k and v have half the heads
SEGMENTS = torch.tensor([[0, 0, 0, 1, 1, 2, 2], [0, 0, 0, 0, 0, 1, 1]])
PADDING = torch.tensor([[1, 1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1, 1]], dtype=torch.bool)  # row 1 left-padded

# variant -> (window, softcap, packed, padded, path that must run)
VARIANTS = {
    "causal": (None, None, False, False, "sdpa"),
    "window_below_seq": (3, None, False, False, "masked"),
    "window_at_least_seq": (T, None, False, False, "sdpa"),
    "softcap": (None, 5.0, False, False, "masked"),
    "window_softcap": (4, 2.0, False, False, "masked"),
    "packed": (None, None, True, False, "masked"),
    "packed_window": (2, None, True, False, "masked"),
    "padded": (None, None, False, True, "masked"),
    "padded_window_softcap": (3, 5.0, False, True, "masked"),
}


class _Heads(nn.Module):
    num_key_value_groups = HQ // HK


def _mask_function(window, segments):
    function = masking_utils.causal_mask_function
    if window is not None:
        function = masking_utils.sliding_window_causal_mask_function(window)
    if segments is not None:
        function = masking_utils.and_masks(function, masking_utils.packed_sequence_mask_function(segments))
    return function


def _eager_reference(q, k, v, window, softcap, segments, padding):
    mask = masking_utils.eager_mask(batch_size=B, q_length=T, kv_length=T, mask_function=_mask_function(window, segments),
                                    attention_mask=padding, dtype=q.dtype, device=q.device)
    out, _ = eager_attention_forward(_Heads(), q, k, v, mask, scaling=D ** -0.5, softcap=softcap)
    return out.transpose(1, 2)  # eager returns (B, T, H, D)


@pytest.mark.parametrize("backend", ["reference", "flex"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matches_eager_forward_and_backward(variant, backend, device):
    """FlexAttention has no CPU backward: there its mask and score mods are checked forward only (the GPU
    runs this file with backward)."""
    window, softcap, packed, padded, path = VARIANTS[variant]
    if backend == "flex" and core.flex_attention is None:
        pytest.skip("no FlexAttention in this torch")
    if backend == "flex" and path == "sdpa":
        pytest.skip("runs SDPA whatever the backend")
    backward = backend != "flex" or device == "cuda"
    padding = PADDING.to(device) if padded else None
    segments = SEGMENTS.to(device) if packed else None
    q, k, v = (torch.randn(B, h, T, D, device=device).requires_grad_(backward) for h in (HQ, HK, HK))
    chosen = choose_backend(q, effective_window(window, T), softcap, padding, segments)
    assert (chosen == "sdpa") == (path == "sdpa")

    out = causal_attention(q, k, v, scale=D ** -0.5, window=window, softcap=softcap, padding=padding,
                           segments=segments, backend=None if path == "sdpa" else backend)
    expected = _eager_reference(q, k, v, window, softcap, segments, padding)
    real = padding[:, None, :, None].expand_as(out) if padded else torch.ones_like(out, dtype=torch.bool)
    # float32 on the GPU: FlexAttention and SDPA may use TF32-free but reordered sums; 1e-5 holds on the CPU
    torch.testing.assert_close(out[real], expected[real], rtol=1e-5, atol=1e-5 if device == "cpu" else 1e-4)
    if padded and backend == "flex":  # rows with no visible key: every path gives the reference's output
        with torch.no_grad():
            reference = causal_attention(q, k, v, scale=D ** -0.5, window=window, softcap=softcap, padding=padding,
                                         segments=segments, backend="reference")
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5 if device == "cpu" else 1e-4)
    if not backward:
        return
    grad = torch.randn_like(out) * real  # padding queries' outputs are never read
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    for name, g, w in zip("qkv", got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5 if device == "cpu" else 1e-4,
                                   msg=lambda m, name=name: f"d{name}: {m}")


# Whole models: family, layout, sequence length. The tiny configs' sliding window is 4 (lora_twins).
MODEL_CASES = [
    ("mistral", "packed", 9),    # window < seq inside packed samples
    ("gemma2", "padded", 6),     # soft-capping, alternating sliding/global layers, a left-padded row
]  # plain layouts of every family (and Phi-4-mini's partial rotary) are test_patching's


@pytest.mark.parametrize("family,layout,seq", MODEL_CASES, ids=[f"{c[0]}-{c[1]}" for c in MODEL_CASES])
def test_model_layouts_match_plain_eager(family, layout, seq, device):
    plain, fast = twins(family, device=device, gradient_checkpointing=True)
    assert fast.config._attn_implementation == ATTENTION_NAME and plain.config._attn_implementation == "eager"
    (ids,) = token_batches(1, 2, seq, plain.config.vocab_size, device=device)
    # use_cache=False: a training forward that builds a KV cache turns transformers' packed-row detection off
    inputs = dict(input_ids=ids, labels=ids.clone(), use_cache=False)
    if layout == "packed":
        inputs["position_ids"] = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2], [0, 1, 2, 0, 1, 2, 3, 4, 5]], device=device)
    elif layout == "padded":
        mask = torch.ones_like(ids)
        mask[1, :2] = 0
        inputs["attention_mask"] = mask
        # The last pad position (which sees no real key) would predict the first real token: transformers'
        # eager gives that row uniform weights, its sdpa and our path zeros (test_patching checks that
        # against sdpa). Gemma 2's soft-capping is eager-only, so that label is left out here.
        inputs["labels"] = ids.masked_fill(mask == 0, -100)
        inputs["labels"][1, 2] = -100
    losses = []
    for model in (plain, fast):
        model.train()
        loss = model(**inputs).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
    assert max_relative_error(lora_grads(fast), lora_grads(plain)) < 1e-4


# Our Triton flash attention (backend="triton", opt-in): against the float32 reference of the same inputs.
# name -> (Hq, Hk, T, D, window, softcap); small tiles (below) so that every case crosses several blocks.
FLASH_CASES = {
    "causal_mha": (2, 2, 48, 32, None, None),
    "softcap_gqa": (4, 2, 80, 32, None, 50.0),
    "window_gqa": (4, 2, 80, 64, 20, None),
    "window_softcap_tail": (2, 1, 75, 32, 17, 5.0),
    "window_below_block": (4, 2, 128, 32, 5, 5.0),
    "d256_softcap_window": (4, 2, 80, 256, 40, 50.0),
}
FLASH_SMALL_TILES = dict(fwd=(16, 32, 4, 1), dkdv=(32, 16, 4, 1), dq=(16, 16, 4, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", list(FLASH_CASES))
def test_triton_flash_matches_reference(case, dtype, device, monkeypatch, assert_close_scaled):
    """Forward and dq, dk, dv; the D-256 case under its own (GPU) tiles, the others under small ones, so that
    the loops cross unmasked blocks, window-skipped blocks and a masked tail (T not a multiple of a block)."""
    from lanner.kernels.attention import flash

    hq, hk, t, d, window, softcap = FLASH_CASES[case]
    if d != 256:
        monkeypatch.setitem(flash.TILES, d, FLASH_SMALL_TILES)
    q, k, v = (torch.randn(1, h, t, d, device=device, dtype=dtype).requires_grad_() for h in (hq, hk, hk))
    out = causal_attention(q, k, v, scale=d ** -0.5, window=window, softcap=softcap, backend="triton")
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)

    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    mask = core.dense_mask(t, effective_window(window, t), None, None, device)
    expected = core._reference(q32, k32, v32, d ** -0.5, mask, softcap)
    want = torch.autograd.grad(expected, (q32, k32, v32), grad.float())
    rtol = 1e-4 if dtype == torch.float32 else 3e-2  # bf16: inputs, P and dS rounded to 8 bits of mantissa
    assert out.dtype == dtype and all(g.dtype == dtype for g in got)
    for name, g, w in zip(("out", "dq", "dk", "dv"), (out, *got), (expected, *want)):
        assert not torch.isnan(g).any(), name
        assert_close_scaled(g.float(), w, rtol)


def test_triton_backend_choice_and_fallback_on_padding(device, monkeypatch):
    """"auto" picks it on CUDA for the measured head dims only, never with padding or segments, never on the CPU;
    LANNER_ATTENTION=triton forces it; padding then runs FlexAttention or the reference."""
    d = next(iter(core.TRITON_HEAD_DIMS))
    assert core.auto_backend(d, True, False) == "triton"
    assert core.auto_backend(d, True, True) in ("flex", "reference")
    assert core.auto_backend(d, False, False) == "reference"
    assert core.auto_backend(128, True, False) in ("flex", "reference")
    q, k, v = (torch.randn(B, h, T, 16, device=device) for h in (HQ, HK, HK))
    assert choose_backend(q, 3, 5.0, None, None) in ("flex", "reference")
    # Sinks: our kernel on CUDA ("auto") or asked for (packed samples too), never with padding; else the reference
    assert core._sinks_backend(q, "auto", False) == ("triton" if q.is_cuda else "reference")
    assert core._sinks_backend(q, "triton", False) == "triton" and core._sinks_backend(q, "flex", False) == "reference"
    assert core._sinks_backend(q, "triton", True) == "reference"
    monkeypatch.setenv("LANNER_ATTENTION", "triton")
    assert choose_backend(q, 3, 5.0, None, None) == "triton"
    padding = PADDING.to(device)
    out = causal_attention(q, k, v, window=3, softcap=5.0, padding=padding)
    reference = causal_attention(q, k, v, window=3, softcap=5.0, padding=padding, backend="reference")
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-4)
    # A head dim without tiles (24, 8) runs what "auto" would, said once; compiled FlexAttention takes none below 16
    assert core.auto_backend(8, True, True) == "reference"
    assert core.auto_backend(24, True, True) in ("flex", "reference")
    for d in (24, 8):
        q, k, v = (torch.randn(B, h, T, d, device=device) for h in (HQ, HK, HK))
        out = causal_attention(q, k, v, window=3, softcap=5.0)
        reference = causal_attention(q, k, v, window=3, softcap=5.0, backend="reference")
        torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-4)


# Packed rows for the Triton kernel's packed samples: lengths crossing the small tiles' blocks, a one-token sample,
# and a second row laid out differently (each row's samples are its own).
PACKED_LENGTHS = ((23, 1, 30, 26), (5, 61, 14))


@pytest.mark.parametrize("window, sinks", [(None, False), (20, False), (None, True), (20, True)],
                         ids=["causal", "window", "sinks", "window_sinks"])
def test_triton_flash_on_packed_samples_matches_reference(window, sinks, device, monkeypatch, assert_close_scaled):
    """Packed samples on our Triton kernel (small tiles, GQA) against the reference's dense mask: output, dq, dk,
    dv (and the sinks' gradient) in float32; the block bounds from each sample's start and end skip no visible key."""
    from lanner.kernels.attention import flash

    hq, hk, t, d = 4, 2, 80, 32
    monkeypatch.setitem(flash.TILES, d, FLASH_SMALL_TILES)
    segments = torch.stack([torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
                            for lengths in PACKED_LENGTHS]).to(device)
    q, k, v = (torch.randn(2, h, t, d, device=device).requires_grad_() for h in (hq, hk, hk))
    leaves = [q, k, v] + ([(torch.randn(hq, device=device) * 2).requires_grad_()] if sinks else [])
    computed, sample_bounds = [], flash._sample_bounds

    def counted(ids):
        computed.append(ids)
        return sample_bounds(ids)
    monkeypatch.setattr(flash, "_sample_bounds", counted)
    forward_cache = {}  # one forward's: its layers compute the sample bounds once
    for _ in range(2):
        out = causal_attention(q, k, v, scale=d ** -0.5, window=window, segments=segments,
                               sinks=leaves[3] if sinks else None, block_mask_cache=forward_cache, backend="triton")
    assert len(computed) == 1
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, leaves, grad)
    expected = causal_attention(q, k, v, scale=d ** -0.5, window=window, segments=segments,
                                sinks=leaves[3] if sinks else None, backend="reference")
    want = torch.autograd.grad(expected, leaves, grad)
    for name, g, w in zip(("out", "dq", "dk", "dv", "d_sinks"), (out, *got), (expected, *want)):
        assert not torch.isnan(g).any(), name
        assert_close_scaled(g, w, 1e-4)
    # the packed rows are not one causal row: without segments the output differs
    plain = causal_attention(q, k, v, scale=d ** -0.5, window=window, sinks=leaves[3] if sinks else None,
                             backend="triton")
    assert (plain - out).abs().max() > 1e-2


class _SinkHeads(nn.Module):
    """What gpt-oss's eager attention reads from its module: the sinks and the GQA group size."""

    num_key_value_groups = HQ // HK

    def __init__(self, sinks):
        super().__init__()
        self.sinks = sinks


@pytest.mark.parametrize("window", [None, 3])
def test_sinks_match_gpt_oss_eager_forward_and_backward(window, device):
    """The reference path with sinks against gpt-oss's own eager attention (float32): output and the
    gradients of q, k, v and the sinks, with and without a sliding window."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward as gpt_oss_eager

    q, k, v = (torch.randn(B, h, T, D, device=device, requires_grad=True) for h in (HQ, HK, HK))
    sinks = (torch.randn(HQ, device=device) * 2).requires_grad_()
    out = causal_attention(q, k, v, scale=D ** -0.5, window=window, sinks=sinks)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, sinks), grad)

    mask = masking_utils.eager_mask(batch_size=B, q_length=T, kv_length=T, mask_function=_mask_function(window, None),
                                    attention_mask=None, dtype=q.dtype, device=q.device)
    expected, _ = gpt_oss_eager(_SinkHeads(sinks), q, k, v, mask, scaling=D ** -0.5)
    expected = expected.transpose(1, 2)
    want = torch.autograd.grad(expected, (q, k, v, sinks), grad)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    for name, g, w in zip(("dq", "dk", "dv", "d_sinks"), got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("case, dtype", [("causal_mha", torch.float32), ("window_gqa", torch.float32),
                                         ("window_gqa", torch.bfloat16)])
def test_triton_flash_with_sinks_matches_reference(case, dtype, device, monkeypatch, assert_close_scaled):
    """Sinks on our Triton kernel (small tiles) against the reference path's: output, dq, dk, dv and the
    sinks' gradient (large sinks, so that they take a real share of each row)."""
    from lanner.kernels.attention import flash

    hq, hk, t, d, window, softcap = FLASH_CASES[case]
    monkeypatch.setitem(flash.TILES, d, FLASH_SMALL_TILES)
    q, k, v = (torch.randn(1, h, t, d, device=device, dtype=dtype).requires_grad_() for h in (hq, hk, hk))
    sinks = (torch.randn(hq, device=device) * 3).to(dtype).requires_grad_()
    out = causal_attention(q, k, v, scale=d ** -0.5, window=window, softcap=softcap, sinks=sinks, backend="triton")
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v, sinks), grad)

    leaves = [x.detach().float().requires_grad_() for x in (q, k, v, sinks)]
    expected = causal_attention(*leaves[:3], scale=d ** -0.5, window=window, softcap=softcap, sinks=leaves[3],
                                backend="reference")
    want = torch.autograd.grad(expected, leaves, grad.float())
    rtol = 1e-4 if dtype == torch.float32 else 3e-2
    for name, g, w in zip(("out", "dq", "dk", "dv", "d_sinks"), (out, *got), (expected, *want)):
        assert g.dtype == dtype and not torch.isnan(g).any(), name
        assert_close_scaled(g.float(), w, rtol)


class _Store:
    """A `kept` of attention/kept_sdpa.py that keeps what the forward stored, as the graphed layers do (there in
    host memory), and counts what the recompute took."""

    def __init__(self):
        self.stored, self.taken = None, 0

    def store(self, out, lse, extras):
        self.stored = out.clone(), lse.clone(), extras

    def take(self):
        self.taken += self.stored is not None
        return self.stored


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("path", ["sdpa", "triton-window-softcap"])
def test_a_recompute_takes_the_forwards_attention_output_and_differentiates_as_without(path, dtype, device):
    """With a store for the attention output (the memory engine's graphed layers), the causal path runs SDPA's own
    flash kernel (and a window with a soft-cap our Triton kernel): the forward stores its output and log-sum-exp,
    the recompute takes them instead of computing, and the gradients are those of the path without a store, bit for
    bit (GQA unexpanded). With nothing stored yet the recompute computes."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(B, h, 40, 16, device=device, dtype=dtype) for h in (HQ, HK, HK))
    grad = torch.randn(B, HQ, 40, 16, device=device, dtype=dtype)
    options = dict(scale=0.3) if path == "sdpa" else dict(scale=0.3, window=20, softcap=5.0, backend="triton")
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if path == "sdpa":
        expected = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=True, scale=0.3, enable_gqa=True)
    else:
        expected = causal_attention(*leaves, **options)
    expected_grads = torch.autograd.grad(expected, leaves, grad)

    store = _Store()
    with torch.no_grad():  # the forward (graphed recomputed layers run it without autograd)
        out = causal_attention(q, k, v, **options, kept=store, recomputing=False)
    assert torch.equal(out, expected.detach())
    if path == "sdpa" and kept_sdpa.fused_kernel(q, k, v, 0.3) is None:  # (CUDA's fused kernels take no float32)
        assert store.stored is None and device == "cuda" and dtype == torch.float32
        return
    assert store.stored is not None
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    again = causal_attention(*leaves, **options, kept=store, recomputing=True)
    assert store.taken == 1 and torch.equal(again.detach(), expected.detach())
    for actual, wanted in zip(torch.autograd.grad(again, leaves, grad), expected_grads):
        assert torch.equal(actual, wanted)
    store.stored = (store.stored[0] * 2, *store.stored[1:])  # what the store holds is what the recompute returns
    assert torch.equal(causal_attention(q, k, v, **options, kept=store, recomputing=True), expected.detach() * 2)
    fresh = _Store()
    computed = causal_attention(q, k, v, **options, kept=fresh, recomputing=True)
    assert fresh.taken == 0 and fresh.stored is None and torch.equal(computed, expected.detach())


@pytest.mark.parametrize("broken", ["raises", "wrong"])
def test_a_torch_whose_fused_kernels_take_other_arguments_recomputes_the_attention(broken, device, monkeypatch, caplog):
    """The direct calls are torch's internals: checked once per kernel, dtype and head shape against SDPA's own,
    they turn the kept attention off (one log line) where they fail or differ, and the attention is computed as
    without a store."""
    q, k, v = (torch.randn(B, h, 40, 16, device=device, dtype=torch.bfloat16) for h in (HQ, HK, HK))
    if kept_sdpa.fused_kernel(q, k, v, 0.3) is None:
        pytest.skip("no fused kernel here to call directly")
    forward = kept_sdpa._forward

    def broken_forward(*args):
        if broken == "raises":
            raise RuntimeError("expected at most 8 argument(s)")
        out, lse, extras = forward(*args)
        return out * 2, lse, extras

    monkeypatch.setattr(kept_sdpa, "_forward", broken_forward)
    kept_sdpa._works.cache_clear()
    try:
        assert kept_sdpa.fused_kernel(q, k, v, 0.3) is None
        store = _Store()
        out = causal_attention(q, k, v, scale=0.3, kept=store)
        assert store.stored is None and torch.equal(
            out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True))
        assert "recompute their attention" in caplog.text
    finally:
        kept_sdpa._works.cache_clear()
