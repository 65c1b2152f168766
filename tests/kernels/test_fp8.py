"""FP8 base weights (docs/fp8.md): e4m3 quantisation bounds, the FP8 GEMM (emulated on the CPU, the
tensor cores on a GPU of compute capability 8.9+), FP8Linear's forward and input gradient, LoRA over
an FP8 base on the kernels and on PEFT's plain path, the merged export's logits, and the error in
words on older GPUs.

The bounds are derived, not fitted: e4m3 has 3 mantissa bits, so rounding a value whose magnitude
is in e4m3's normal range (>= 2^-6 after scaling) errs by at most U = 2^-4 of it, and a subnormal one
by at most half the subnormal spacing, 2^-10 (times the row's scale).
"""
import copy

import pytest
import torch

from lanner.kernels import dequantize_model, get_lora_model, lora
from lanner.kernels.ops.fp8_matmul import (
    E4M3_MAX, EMULATE_ENV, FP8Unsupported, fp8_backend, fp8_matmul, quantize_rows,
)
from lanner.kernels.patching.binding import is_patched
from lanner.kernels.quant import FP8Linear, FP8Weight, dequantize_fp8, quantize_fp8
from lanner.kernels.quant.fp8 import fp8_forward, fp8_input_grad
from lora_twins import lora_grads, max_relative_error, randomise_lora, tiny_model, token_batches
from test_memory_engine import GRAD_RTOL, LOSS_RTOL, _force_plan, _step

U = 2.0**-4
SUBNORMAL_HALF_SPACING = 2.0**-10
FLOAT32_U = 2.0**-24
# Every projection a multiple of 16 (the FP8 GEMM's rule): head_dim 16, 2 KV heads -> k/v of 32.
FP8_SIZES = dict(hidden_size=64, intermediate_size=128)


def rounding_bound(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The largest error of x's e4m3 rounding at that row scale, elementwise (plus float32's share)."""
    return torch.maximum(U * x.abs(), SUBNORMAL_HALF_SPACING * scale) * (1 + 1e-6) + 4 * FLOAT32_U * x.abs()


def wide_rows(rows, cols, seed=0):
    """Rows spanning eight binades of magnitude, with values deep in e4m3's subnormal range too."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g, dtype=torch.float64)
    x *= torch.logspace(-4, 4, rows, base=2, dtype=torch.float64)[:, None]
    x[:, :3] *= 1e-5  # far below each row's amax / 448 * 2^-6
    return x.float()


def test_quantise_round_trip_is_within_the_e4m3_bound():
    w = wide_rows(33, 80)
    w[7] = 0  # an all-zero row
    fp8 = quantize_fp8(w)
    assert fp8.codes.dtype == torch.uint8 and fp8.scale.shape == (33,) and fp8.scale.dtype == torch.float32
    back = dequantize_fp8(fp8)
    err = (back.double() - w.double()).abs()
    bound = rounding_bound(w, fp8.scale[:, None]).double()
    assert (err <= bound).all(), f"worst excess {(err - bound).max().item()}"
    assert torch.equal(back[7], torch.zeros(80))
    # each row's largest magnitude maps to 448 and comes back within float32 rounding
    torch.testing.assert_close(back.abs().amax(1), w.abs().amax(1), rtol=2 * FLOAT32_U, atol=0)
    assert fp8.e4m3.float().abs().amax(1)[fp8.scale != 1].eq(E4M3_MAX).all()
    # the bound is tight enough to mean something: typical errors are a few percent
    assert 0.005 < (err / w.abs().clamp_min(1e-30))[:, 3:].mean() < U


def test_quantise_rows_clamps_and_keeps_bf16_inputs():
    x = torch.tensor([[1.0, -2.0, 0.5], [0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    codes, scale = quantize_rows(x)
    assert codes.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    assert torch.equal(scale[:, 0], torch.tensor([2.0, E4M3_MAX]) / E4M3_MAX)
    assert codes.float()[0].tolist() == [224.0, -448.0, 112.0]


def test_quantise_rows_in_chunks_is_the_same_and_leaves_its_input_alone(monkeypatch):
    from lanner.kernels.ops import fp8_matmul as ops

    x, column_scale = wide_rows(37, 48), torch.rand(48) + 0.5
    before = x.clone()
    whole = quantize_rows(x, column_scale)
    monkeypatch.setattr(ops, "QUANTIZE_CHUNK_ELEMENTS", 5 * 48)  # 8 chunks, the last of 2 rows
    chunked = quantize_rows(x, column_scale)
    assert torch.equal(x, before)
    assert torch.equal(chunked[0].view(torch.uint8), whole[0].view(torch.uint8)) and torch.equal(chunked[1], whole[1])
    torch.testing.assert_close(whole[1][:, 0], (x * column_scale).abs().amax(1) / E4M3_MAX, rtol=FLOAT32_U, atol=0)


def test_rows_shared_by_projections_are_quantised_once(monkeypatch):
    from lanner.kernels.quant import fp8 as fp8_module

    q, k = (FP8Linear.from_linear(torch.nn.Linear(32, 16)) for _ in range(2))
    calls = []
    monkeypatch.setattr(fp8_module, "quantize_rows", lambda x, *a: calls.append(x) or quantize_rows(x, *a))
    x = torch.randn(5, 32)
    first = fp8_forward(q, x), fp8_forward(k, x)
    assert len(calls) == 1
    x.mul_(2)  # changed in place: quantised again
    torch.testing.assert_close(fp8_forward(q, x), 2 * first[0], rtol=1e-6, atol=1e-6)
    fp8_forward(q, x.clone())
    assert len(calls) == 3
    with torch.inference_mode():  # no version counter: quantised at every product
        rows = torch.randn(5, 32)
        fp8_forward(q, rows), rows.mul_(2)
        torch.testing.assert_close(fp8_forward(k, rows), fp8_forward(k, rows.clone()), rtol=0, atol=0)
    assert len(calls) == 6


def gemm_bound(x, w, x_scale, w_scale):
    """|Q(x) Q(w)^T - x w^T| <= (|x| + Ex)(|w| + Ew)^T - |x||w|^T, plus float32 summation."""
    ex, ew = rounding_bound(x, x_scale).double(), rounding_bound(w, w_scale).double()
    ax, aw = x.abs().double(), w.abs().double()
    first = (ax + ex) @ (aw + ew).t() - ax @ aw.t()
    return first + x.shape[1] * 2 * FLOAT32_U * ((ax + ex) @ (aw + ew).t())


def test_emulated_gemm_is_within_the_derived_bound_of_float32():
    x, w = wide_rows(24, 96, seed=1), wide_rows(40, 96, seed=2)
    xq, xs = quantize_rows(x)
    wq, ws = quantize_rows(w)
    out = fp8_matmul(xq, xs, wq, ws.view(-1), torch.float32, "emulated")
    reference = x.double() @ w.double().t()
    err = (out.double() - reference).abs()
    bound = gemm_bound(x, w, xs, ws)
    assert (err <= bound).all()
    assert (err.max() / reference.abs().max()) < 0.1 and err.max() > 0
    # exact arithmetic on the codes: only float32's summation order and the scales' rounding differ
    exact = (xq.double() * xs.double()) @ (wq.double() * ws.double()).t()
    torch.testing.assert_close(out.double(), exact, rtol=1e-5, atol=1e-5 * exact.abs().max().item())


def fp8_gpu():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not fp8_gpu(), reason="FP8 tensor cores: CUDA compute capability 8.9 or newer")
def test_scaled_mm_matches_the_emulation():
    x, w = wide_rows(256, 512, seed=3).cuda(), wide_rows(384, 512, seed=4).cuda()
    xq, xs = quantize_rows(x)
    wq, ws = quantize_rows(w)
    gpu = fp8_matmul(xq, xs, wq, ws.view(-1), torch.bfloat16, "scaled_mm")
    emulated = fp8_matmul(xq, xs, wq, ws.view(-1), torch.float32, "emulated")
    # One bf16 rounding of the output (2^-8 of each element), and the tensor cores' accumulator: Hopper's
    # FP8 MMA keeps about 14 mantissa bits between promotions to float32 (DeepSeek-V3 report, 3.3.2), so
    # a sum errs by a small fraction of the |products| it adds, which exceeds the output where they cancel.
    # 2^-10 of that sum still catches a wrong scale or layout (an error of the output's own size).
    magnitudes = fp8_matmul(xq.float().abs().to(xq.dtype), xs, wq.float().abs().to(wq.dtype), ws.view(-1),
                            torch.float32, "emulated")
    excess = (gpu.float() - emulated).abs() - 2**-8 * emulated.abs()
    print(f"worst accumulation error / sum of |products|: {(excess / magnitudes).max().item():.3e}")
    assert (excess <= 2**-10 * magnitudes + 1e-30).all()


def test_fp8_linear_forward_and_input_gradient_match_the_dequantised_weight():
    linear = torch.nn.Linear(96, 48, bias=True)
    layer = FP8Linear.from_linear(linear)
    weight = layer.dense_weight(torch.float32)  # exactly what forward multiplies by
    x = wide_rows(20, 96, seed=5).requires_grad_(True)
    out = layer(x)
    _, xs = quantize_rows(x.detach())
    assert (out.detach().double() - (x.detach().double() @ weight.double().t() + linear.bias.double())).abs().le(
        gemm_bound(x.detach(), weight, xs, torch.zeros(48, 1)) + 1e-6).all()
    dout = wide_rows(20, 48, seed=6)
    out.backward(dout)
    # dx = dout @ W for the forward's very W: only dout's per-token rounding (after the weight scale
    # goes onto its columns) errs
    scaled = dout * layer.fp8.scale
    _, ds = quantize_rows(scaled)
    codes = layer.fp8.e4m3.double()
    bound = rounding_bound(scaled, ds).double() @ codes.abs() + 96 * 2 * FLOAT32_U * (scaled.abs().double() @ codes.abs())
    reference = dout.double() @ weight.double()
    assert ((x.grad.double() - reference).abs() <= bound * (1 + 1e-5) + 1e-7).all()
    assert (x.grad.double() - reference).abs().max() > 0  # dout really went through FP8
    torch.testing.assert_close(layer.bias.grad if layer.bias.grad is not None else dout.sum(0), dout.sum(0))
    # the LoRA functions' products are the layer's own
    torch.testing.assert_close(fp8_forward(layer, x.detach()) + linear.bias, out.detach())
    torch.testing.assert_close(fp8_input_grad(layer, dout), x.grad)


def test_fp8_linear_survives_dtype_casts_moves_and_state_dicts():
    layer = FP8Linear.from_linear(torch.nn.Linear(32, 16))
    codes, scale = layer.weight.detach().clone(), layer.fp8.scale.clone()
    layer.to(torch.bfloat16)
    assert torch.equal(layer.weight, codes) and layer.fp8.scale.dtype == torch.float32
    fresh = FP8Linear.from_linear(torch.nn.Linear(32, 16))
    fresh.load_state_dict(layer.state_dict())
    assert torch.equal(fresh.weight, codes) and torch.equal(fresh.fp8.scale, scale)


def fp8_model(dtype=torch.float32, device="cpu", num_hidden_layers=2, **kwargs):
    model = tiny_model("llama", dtype, device, num_hidden_layers=num_hidden_layers, **FP8_SIZES)
    return get_lora_model(model, load_in_fp8=True, **kwargs)


def fp8_layers(model):
    return [m for m in model.modules() if isinstance(m, FP8Linear)]


def step_grads(model, ids):
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.item(), lora_grads(model)


def test_lora_on_the_kernels_over_fp8_equals_peft_plain_path_over_fp8(device, monkeypatch):
    """The kernels' FP8 products against FP8Linear's own forward under PEFT: the same arithmetic, once the
    kernels multiply q/k/v's and gate/up's gradients one projection at a time as PEFT does (their joined
    product rounds each token's gradients to one scale: test_lora_grads_over_fp8_are_those_over_the_..._noise)."""
    monkeypatch.setitem(lora._BASE_MATMULS, FP8Linear, lora.BaseMatmul(fp8_forward, fp8_input_grad))
    plain = fp8_model(device=device, use_kernels=False, gradient_checkpointing=False)
    fast = fp8_model(device=device, gradient_checkpointing=True)
    assert len(fp8_layers(fast)) == 7 * 2
    assert is_patched(fast.get_base_model().model.layers[0].mlp)
    randomise_lora(plain), randomise_lora(fast)
    ids = token_batches(1, 2, 6, fast.config.vocab_size, device=device)[0]
    (loss_plain, grads_plain), (loss_fast, grads_fast) = step_grads(plain, ids), step_grads(fast, ids)
    # On the tensor cores each FP8 product is rounded to bf16, where the kernels add the LoRA term in the
    # GEMM's epilogue and PEFT after it: an element may round the other way (as in the engine test below).
    loss_rtol, grad_rtol = (1e-5, 1e-4) if device == "cpu" else (1e-4, 1e-2)
    assert abs(loss_fast - loss_plain) <= loss_rtol * loss_plain
    assert max_relative_error(grads_fast, grads_plain) < grad_rtol


@pytest.mark.parametrize("mlp_tile_rows", [4, None])
def test_the_memory_engine_over_fp8_gives_the_gradients_of_no_checkpointing(device, mlp_tile_rows):
    """A stashed layer, an offloaded recomputed one (its MLP in tiles of 4 rows, or whole with its up projection,
    which leaves its rank-r term to the GLU kernel, in host memory), a kept one, over an FP8 base: the
    quantisation is deterministic, so the recompute reproduces forward's FP8 products."""
    reference = fp8_model(device=device, num_hidden_layers=3, gradient_checkpointing=False)
    engined = fp8_model(device=device, num_hidden_layers=3, gradient_checkpointing=True)
    randomise_lora(reference)
    engined.load_state_dict(reference.state_dict())
    _force_plan(engined, ["keep_mlp", "recompute", "keep"], (0, 1), mlp_tile_rows=mlp_tile_rows)
    for ids in token_batches(1, 2, 5, reference.config.vocab_size, device=device):
        loss_ref, grads_ref = _step(reference, ids)
        loss, grads = _step(engined, ids)
        # On the tensor cores every FP8 product is rounded to bf16, and a tiled MLP sums in another order:
        # an element may round the other way there.
        loss_rtol, grad_rtol = (LOSS_RTOL, GRAD_RTOL) if device == "cpu" else (1e-4, 1e-2)
        torch.testing.assert_close(loss, loss_ref, rtol=loss_rtol, atol=0)
        assert max_relative_error(grads, grads_ref) < grad_rtol


def test_lora_grads_over_fp8_are_those_over_the_dequantised_base_within_fp8_noise(device):
    """The only difference left: activations and output gradients rounded to e4m3 per token. One rounding
    errs by U/sqrt(3)-ish RMS of each value (at most U = 2^-4), and a LoRA gradient here goes through up
    to four quantised GEMMs on its path (x of its own projection, dy through the base GEMMs above it),
    so about sqrt(2 * 4) * U / sqrt(3) ~ 0.1 RMS relative: bounded by 2U. Measured: loss 4e-4 relative
    apart, every gradient within 2.3e-2..6.1e-2 (Frobenius) of the dense one's. The noise is per step
    and unbiased: benchmarks/fp8_fidelity.py measures what it does to a 300-step loss curve."""
    fp8 = fp8_model(device=device, gradient_checkpointing=False)
    dense = dequantize_model(copy.deepcopy(fp8))
    assert not fp8_layers(dense) and fp8_layers(fp8)
    randomise_lora(fp8), randomise_lora(dense)
    ids = token_batches(1, 2, 6, fp8.config.vocab_size, device=device)[0]
    (loss8, grads8), (loss16, grads16) = step_grads(fp8, ids), step_grads(dense, ids)
    assert abs(loss8 - loss16) <= U * 0.05 * loss16
    errors = [((grads8[k] - grads16[k]).norm() / grads16[k].norm()).item() for k in grads16]
    assert len(errors) == 28 and 0 < min(errors) and max(errors) < 2 * U


def test_merged_export_gives_the_fp8_trained_models_logits_within_the_bound(device):
    """docs/fp8.md: the merged model (original 16-bit weights + adapter) differs from the FP8-trained
    model by the base's quantisation noise, to first order independent of the adapter: within
    2x the un-adapted base's 16-bit vs FP8 gap, plus the merge's bf16 rounding."""
    dtype = torch.bfloat16
    original = tiny_model("llama", dtype, device, **FP8_SIZES)
    model = get_lora_model(copy.deepcopy(original), load_in_fp8=True, gradient_checkpointing=False)
    randomise_lora(model, std=0.2)
    model.eval()
    ids = token_batches(1, 2, 7, model.config.vocab_size, device=device)[0]
    with torch.no_grad():
        trained = model(input_ids=ids).logits.float()
        with model.disable_adapter():
            base8 = model(input_ids=ids).logits.float()
        base16 = original(input_ids=ids).logits.float()
        adapter = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
        merged = get_lora_model(original, gradient_checkpointing=False)
        merged.load_state_dict(adapter, strict=False)
        merged = merged.merge_and_unload().eval()
        merged_logits = merged(input_ids=ids).logits.float()
    gap = (base16 - base8).abs().max().item()
    bf16_merge = 3e-2 * trained.abs().max().item()  # as tests/kernels/test_qlora.py's merge
    assert gap > 0
    assert (merged_logits - trained).abs().max().item() <= 2 * gap + bf16_merge
    assert (trained - base8).abs().max().item() > 2 * gap + bf16_merge  # the adapter matters at that bound


def test_fp8_is_refused_in_words_on_gpus_without_it(monkeypatch, request):
    from lanner.kernels.ops import fp8_matmul as ops

    ops._capability_of.cache_clear()  # asked once per device: this test's A100 must not outlive it
    request.addfinalizer(ops._capability_of.cache_clear)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    with pytest.raises(FP8Unsupported) as error:
        fp8_backend(torch.device("cuda"))
    assert str(error.value).startswith("FP8 needs compute capability 8.9 or newer (Ada/Hopper); this GPU is "
                                       "NVIDIA A100-SXM4-80GB (8.0)")
    assert "qlora" in str(error.value) and EMULATE_ENV in str(error.value)
    monkeypatch.setenv(EMULATE_ENV, "1")  # the fallback: the float32 emulation
    assert fp8_backend(torch.device("cuda")) == "emulated"
    assert fp8_backend(torch.device("cpu")) == "emulated"


def test_layers_the_fp8_gemm_cannot_take_stay_dense(device):
    model = get_lora_model(tiny_model("llama", device=device), load_in_fp8=True, gradient_checkpointing=False)
    layer = model.get_base_model().model.layers[0]
    assert isinstance(layer.self_attn.q_proj.base_layer, FP8Linear)  # 48 x 48
    assert type(layer.self_attn.k_proj.base_layer) is torch.nn.Linear  # 24 outputs: not a multiple of 16
    assert type(model.get_base_model().lm_head) is torch.nn.Linear
    ids = token_batches(1, 1, 4, model.config.vocab_size, device=device)[0]
    model(input_ids=ids, labels=ids).loss.backward()


def part_maxima(x, parts):
    """Each row's largest magnitude in `parts` column blocks (rows, parts), float32: a quantiser's row_amax."""
    return torch.stack([block.abs().amax(1) for block in x.tensor_split(parts, dim=1)], dim=1).float().contiguous()


# (6, 300): sixteen rows a program, read once; (37, 1024): eight (k/v-sized rows); (5, 9000): a row in three
# blocks, read twice, its largest element in the last block.
@pytest.mark.parametrize("shape", [(6, 300), (37, 1024), (5, 9000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_column_scale", [False, True])
def test_the_triton_quantiser_gives_torchs_codes_and_scales_bit_for_bit(shape, dtype, with_column_scale, device):
    from lanner.kernels.ops.fp8_matmul import quantize_rows_torch, quantize_rows_triton

    rows, cols = shape
    x = wide_rows(rows, cols + 16, seed=7).to(device=device, dtype=dtype)[:, :cols]  # rows with their own stride
    x[2] = 0
    # ties between e4m3 neighbours and the subnormal range, where rounding to nearest even decides
    ties = torch.tensor([448, 200, -200, 13, 0.0048828125, 0.00732421875, 0.0017, -0.0029], dtype=dtype)
    x[3, :8] = x[3, -8:] = ties
    x[4, -1] = -1000 * x[4].abs().max()
    column_scale = (torch.rand(cols, device=device) + 0.5) if with_column_scale else None
    codes, scale = quantize_rows_triton(x, column_scale)
    expected_codes, expected_scale = quantize_rows_torch(x, column_scale)
    assert torch.equal(scale, expected_scale)
    assert torch.equal(codes.view(torch.uint8), expected_codes.view(torch.uint8))
    # the rows' largest magnitudes given in parts (as the GLU kernel finds them): each row read once, the same bits
    row_amax = part_maxima(x.float() * (1 if column_scale is None else column_scale), 3)
    for quantise in (quantize_rows_triton, quantize_rows_torch):
        given_codes, given_scale = quantise(x, column_scale, row_amax)
        assert torch.equal(given_scale, expected_scale)
        assert torch.equal(given_codes.view(torch.uint8), expected_codes.view(torch.uint8))
        nonzero = row_amax.amax(1) > 0  # the maxima read, not found again
        assert torch.equal(quantise(x, column_scale, 2 * row_amax)[1][nonzero], 2 * expected_scale[nonzero])


@pytest.mark.parametrize("family, deferred", [("llama", True), ("gemma2", True), ("qwen3", False)])
def test_q_and_k_lora_terms_over_fp8_go_to_the_rope_kernel(family, deferred, monkeypatch, device):
    """Over an FP8 base, q's and k's rank-r terms are left out of their products and added by the RoPE kernel
    (one pass over q and k fewer), unless a per-head norm (Qwen3's) sits between; loss and LoRA gradients as
    with the addmm_ onto each product."""
    from lanner.kernels.patching import attention as attention_module

    model = get_lora_model(tiny_model(family, device=device, **FP8_SIZES), load_in_fp8=True,
                           gradient_checkpointing=False)
    randomise_lora(model)
    ids = token_batches(1, 2, 6, model.config.vocab_size, device=device)[0]
    seen = []
    forward = lora.LoRAQKVFunction.forward
    monkeypatch.setattr(lora.LoRAQKVFunction, "forward", staticmethod(
        lambda ctx, x, dtype, projections, terms, *w: seen.append(terms) or forward(ctx, x, dtype, projections, terms,
                                                                                   *w)))
    loss, grads = step_grads(model, ids)
    assert [sorted(t) if t is not None else None for t in seen] == [["k", "q"] if deferred else None] * 2
    model.zero_grad()
    monkeypatch.setattr(attention_module, "_rope_takes_terms", lambda *args: False)
    loss_added, grads_added = step_grads(model, ids)
    assert abs(loss - loss_added) <= 1e-6 * abs(loss_added)
    assert max_relative_error(grads, grads_added) < 1e-5


# (rows, cols, rank): rows past a tile's 32 and columns past its 128, a rank past RANK_CHUNK's 16 here
@pytest.mark.parametrize("rows, cols, rank", [(70, 200, 20), (5, 64, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_add_with_a_rank_r_term_rounds_the_term_as_an_addmm(rows, cols, rank, dtype, monkeypatch, device,
                                                                     assert_close_scaled):
    """residual + (out + left @ right): the term rounded once onto out (an addmm_), then the residual added; the
    gradient goes whole to both."""
    from lanner.kernels.ops import _utils
    from lanner.kernels.ops.residual import residual_add, unread_sum

    monkeypatch.setattr(_utils, "RANK_CHUNK", 16)
    g = torch.Generator().manual_seed(7)
    residual, out = (torch.randn(2, rows, cols, generator=g).to(device=device, dtype=dtype).requires_grad_()
                     for _ in range(2))
    left = torch.randn(2 * rows, rank, generator=g).to(device=device, dtype=dtype)
    right = (torch.randn(cols, rank, generator=g) * 0.3).to(device=device, dtype=dtype).t()  # B^T: a view
    got = residual_add(residual, out, (left, right))
    # in float32, out + term rounded once to the dtype, then the residual added and rounded
    term_added = torch.addmm(out.detach().float().view(-1, cols), left.float(), right.float()).to(dtype)
    expected = (residual.detach().float() + term_added.float().view(out.shape)).to(dtype)
    assert_close_scaled(got, expected, {torch.float32: 1e-5, torch.bfloat16: 8e-3}[dtype])
    grad = torch.randn_like(got)
    got.backward(grad)
    assert torch.equal(residual.grad, grad) and torch.equal(out.grad, grad)
    assert torch.equal(residual_add(residual, out), residual + out)
    residual.grad = out.grad = None
    unread = unread_sum(residual, out)  # a recompute's: out's values, the sum's gradient
    assert torch.equal(unread, out)
    unread.backward(grad)
    assert torch.equal(residual.grad, grad) and torch.equal(out.grad, grad)


@pytest.mark.parametrize("family, fused", [("llama", True), ("qwen3", True), ("gemma2", False)])
def test_o_and_down_lora_terms_over_fp8_go_to_the_residual_adds(family, fused, monkeypatch, device):
    """Over an FP8 base, a decoder layer of Llama's layout (patching/layers.py) adds o's and down's rank-r terms in
    its residual adds (one pass over each output fewer); Gemma 2's (two more norms) keeps its own forward. Loss and LoRA gradients
    as with the addmm_ onto each product, with and without the memory engine's recompute."""
    from lanner.kernels.patching import layers as layers_module
    from lanner.kernels.patching.binding import unbind_forward

    terms = []
    add = layers_module.residual_add
    monkeypatch.setattr(layers_module, "residual_add", lambda r, o, t=None: terms.append(t is not None) or add(r, o, t))
    for checkpointing in (False, True):
        model = get_lora_model(tiny_model(family, device=device, **FP8_SIZES), load_in_fp8=True,
                               gradient_checkpointing=checkpointing)
        randomise_lora(model)
        if checkpointing:
            _force_plan(model, ["recompute", "recompute"], (0,))
        ids = token_batches(1, 2, 5, model.config.vocab_size, device=device)[0]
        layers = model.get_base_model().model.layers
        assert all(is_patched(layer) == fused for layer in layers)
        terms.clear()
        loss, grads = step_grads(model, ids)
        if fused:  # two adds a layer, each with its term; the recompute repeats the attention's
            assert terms.count(True) == (3 if checkpointing else 2) * len(layers) and all(terms)
        model.zero_grad()
        for layer in layers:
            unbind_forward(layer)
        loss_added, grads_added = step_grads(model, ids)
        assert abs(loss - loss_added) <= 1e-6 * abs(loss_added)
        assert max_relative_error(grads, grads_added) < 1e-5


# (5, 64): many rows a program; (3, 300): a row narrower than its block
@pytest.mark.parametrize("shape", [(5, 64), (3, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset, cast_before_weight", [(0.0, True), (1.0, False)])
def test_a_norm_feeding_fp8_gives_quantize_rows_codes_of_its_output(shape, dtype, offset, cast_before_weight, device):
    from lanner.kernels.ops.fp8_matmul import quantize_rows_torch
    from lanner.kernels.ops.rmsnorm import rms_norm

    x = wide_rows(*shape, seed=11).to(device=device, dtype=dtype)
    x[1] = 0  # a zero row: scale 1
    weight = (torch.randn(shape[1], generator=torch.Generator().manual_seed(3)) * 0.1).to(device=device, dtype=dtype)
    offered = []
    y = rms_norm(x, weight, 1e-6, offset, cast_before_weight, codes_to=lambda *args: offered.append(args))
    # the output as without codes (in float32 the GPU's compiled kernel may sum the squares in another order)
    torch.testing.assert_close(y, rms_norm(x, weight, 1e-6, offset, cast_before_weight))
    (owner, rows, codes, scale), = offered
    assert owner is y and rows.data_ptr() == y.data_ptr() and rows.shape == shape
    expected_codes, expected_scale = quantize_rows_torch(y)
    assert torch.equal(scale, expected_scale) and scale[1].item() == 1
    assert torch.equal(codes.view(torch.uint8), expected_codes.view(torch.uint8))


@pytest.mark.parametrize("family, mlp_norm", [("llama", "post_attention_layernorm"),
                                              ("gemma2", "pre_feedforward_layernorm"), ("phi3", "post_attention_layernorm")])
def test_norms_before_fp8_projections_quantise_for_them(family, mlp_norm, monkeypatch, device):
    """The input norm and the MLP's norm quantise their outputs in their own pass; q/k/v (Phi-3's qkv) and
    gate/up take those codes, so only o's and down's inputs are quantised by a product, and the loss is the
    same to the bit as with every product quantising its own rows."""
    from lanner.kernels.ops.rmsnorm import RMSNormFunction
    from lanner.kernels.quant import fp8 as fp8_module

    model = get_lora_model(tiny_model(family, device=device, **FP8_SIZES), load_in_fp8=True,
                           gradient_checkpointing=False)
    layers = model.get_base_model().model.layers
    for layer in layers:
        feeding = {name for name, module in layer.named_children() if getattr(module, "forward", None) is not None
                   and getattr(module.forward, "keywords", {}).get("codes_to") is fp8_module.offer_quantised}
        assert feeding == {"input_layernorm", mlp_norm}
    ids = token_batches(1, 2, 6, model.config.vocab_size, device=device)[0]
    calls = []
    monkeypatch.setattr(fp8_module, "quantize_rows", lambda x, *a: calls.append(x.shape) or quantize_rows(x, *a))
    fused = model(input_ids=ids, labels=ids).loss
    assert len(calls) == 2 * len(layers)  # o's and down's inputs
    forward = RMSNormFunction.forward
    monkeypatch.setattr(RMSNormFunction, "forward",
                        staticmethod(lambda ctx, *args: forward(ctx, *args[:5], None, *args[6:])))  # no codes_to
    calls.clear()
    plain = model(input_ids=ids, labels=ids).loss
    assert len(calls) == 4 * len(layers)
    assert torch.equal(fused, plain)


def test_short_rows_share_a_quantiser_program_and_are_read_once():
    from lanner.kernels.ops.fp8_matmul import quantize_tile

    assert quantize_tile(1024) == (8, 1024)  # k/v-sized gradients: eight rows a program, each read once
    assert quantize_tile(300) == (16, 512)
    assert quantize_tile(4096) == (2, 4096)
    assert quantize_tile(14336) == (1, 4096)  # the MLP's rows: in four blocks, read twice
    assert quantize_tile(14336, column_scale=True) == (1, 2048)  # a gradient's: with its column scale beside


@pytest.mark.parametrize("shape", [(48, 80), (16, 16), (272, 1040), (37, 5)])
def test_the_triton_transpose_is_the_transpose_bit_for_bit(shape, device):
    from lanner.kernels.ops.fp8_matmul import transpose_into

    codes = torch.randint(0, 256, shape, dtype=torch.uint8, device=device)
    out = torch.full(shape[::-1], 7, dtype=torch.uint8, device=device)
    assert transpose_into(codes, out) is out
    assert torch.equal(out, codes.t().contiguous())
    with pytest.raises(ValueError):
        transpose_into(codes, out.t())


FAST_ACCUM_CALLS = []  # fake_scaled_mm's use_fast_accum, call by call


def fake_scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False):
    """torch._scaled_mm's row-wise contract on the CPU: b column-major, scales (M, 1) and (1, N) float32,
    a bf16 bias (N,) added to the scaled float32 sums in the epilogue, one rounding to bf16. Its sums are
    float32 whatever use_fast_accum asks (recorded in FAST_ACCUM_CALLS)."""
    assert a.stride(1) == 1 and b.stride(0) == 1, "a row-major, b column-major"
    assert scale_a.shape == (a.shape[0], 1) and scale_b.shape == (1, b.shape[1])
    assert out_dtype == torch.bfloat16 and scale_result is None
    FAST_ACCUM_CALLS.append(use_fast_accum)
    assert bias is None or (bias.dtype == torch.bfloat16 and bias.shape == (b.shape[1],))
    out = (a.float() @ b.float()) * scale_a * scale_b
    return (out if bias is None else out + bias).to(torch.bfloat16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the real torch._scaled_mm: test_scaled_mm_matches_the_emulation")
def test_the_tensor_core_path_takes_the_bias_in_its_epilogue_and_the_triton_transpose(monkeypatch):
    """The scaled_mm branch on the CPU, against a stand-in for torch._scaled_mm: forward hands it the bias
    (one rounding of product + bias, as the emulation's), the input gradient W^T's codes from the Triton
    transpose, column-major."""
    from lanner.kernels.quant import fp8 as fp8_module

    layer = FP8Linear.from_linear(torch.nn.Linear(96, 48, bias=True)).to(torch.bfloat16)
    x, dout = wide_rows(20, 96, seed=8).bfloat16(), wide_rows(20, 48, seed=9).bfloat16()
    bias = layer.bias.detach()
    emulated = fp8_forward(layer, x, bias), fp8_input_grad(layer, dout)
    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    monkeypatch.setattr(fp8_module, "fp8_backend", lambda device: "scaled_mm")
    FAST_ACCUM_CALLS.clear()
    assert torch.equal(fp8_forward(layer, x.clone(), bias), emulated[0])
    assert torch.equal(fp8_input_grad(layer, dout), emulated[1])
    assert FAST_ACCUM_CALLS == [fp8_module.FORWARD_FAST_ACCUM, fp8_module.INPUT_GRAD_FAST_ACCUM]  # each its own
    # one rounding, not two: the bias joins the float32 sums
    codes, scale = quantize_rows(x)
    sums = fp8_matmul(codes, scale, layer.fp8.e4m3, layer.fp8.scale, torch.float32, "emulated")
    assert torch.equal(emulated[0], (sums + bias.float()).bfloat16())


def fp8_projections(widths, seed, bias=True):
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    return [lora.LoRAProjection(FP8Linear.from_linear(torch.nn.Linear(64, n, bias=bias)),
                                         torch.randn(4, 64, generator=g), torch.randn(n, 4, generator=g), 0.5)
            for n in widths]


def stacked(layers):
    """One FP8 layer whose rows are the layers' rows: its input gradient of the joined douts is their joined one."""
    fp8s = [layer.fp8 for layer in layers]
    weight = FP8Weight(torch.cat([f.codes for f in fp8s]), torch.cat([f.scale for f in fp8s]), fp8s[0].dtype)
    return FP8Linear(weight)


def test_projections_sharing_rows_get_dx_from_one_fp8_product_with_the_rank_r_term_on_it(monkeypatch):
    """q/k/v over FP8: dX is one FP8 product of the three douts side by side (one scale per token over all three)
    with the stacked weights, the joint rank-r product added onto it in one addmm_; forward's bias goes into
    the FP8 GEMM."""
    from lanner.kernels.quant import fp8 as fp8_module

    products, biases = [], []

    def joined(layers, douts):
        products.append(fp8_module.fp8_joined_input_grad(layers, douts))
        return products[-1]

    def forward(layer, x2, bias=None):
        biases.append(bias)
        return fp8_forward(layer, x2, bias)

    monkeypatch.setitem(lora._BASE_MATMULS, FP8Linear, lora.BaseMatmul(forward, fp8_input_grad, joined))
    projections = fp8_projections((64, 32, 32), seed=10)
    g = torch.Generator().manual_seed(11)
    x2 = torch.randn(10, 64, generator=g)
    outs, xas = zip(*(lora._project(x2, p) for p in projections))
    assert [b is p.base.bias for b, p in zip(biases, projections)] == [True] * 3
    for out, xa, p in zip(outs, xas, projections):
        expected = fp8_forward(p.base, x2) + p.base.bias + 0.5 * xa @ p.lora_B.t()
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    douts = [torch.randn(10, p.lora_B.shape[0], generator=g) for p in projections]
    dx, _ = lora._shared_input_backward(x2, douts, xas, projections)
    assert dx is products[0] and len(products) == 1
    base = fp8_input_grad(stacked([p.base for p in projections]), torch.cat(douts, dim=1))
    expected = base + sum(0.5 * (d @ p.lora_B) @ p.lora_A for d, p in zip(douts, projections))
    torch.testing.assert_close(dx, expected, rtol=1e-5, atol=1e-5)
    # each product alone, as a base without a joined one adds them: the same sum within dy's rounding
    separate = sum(fp8_input_grad(p.base, d) for d, p in zip(douts, projections))
    exact = sum(d.double() @ dequantize_fp8(p.base.fp8, torch.float64) for d, p in zip(douts, projections))
    bound = sum(rounding_bound(d * p.base.fp8.scale, (d * p.base.fp8.scale).abs().amax(1, keepdim=True) / 448).double()
                @ p.base.fp8.e4m3.double().abs() for d, p in zip(douts, projections))
    assert ((separate.double() - exact).abs() <= bound + 1e-5).all()
    joined_sum = torch.cat(douts, 1) * torch.cat([p.base.fp8.scale for p in projections])
    joined_bound = rounding_bound(joined_sum, joined_sum.abs().amax(1, keepdim=True) / 448).double() @ torch.cat(
        [p.base.fp8.e4m3.double() for p in projections]).abs()
    assert ((base.double() - exact).abs() <= joined_bound + 1e-5).all()


@pytest.mark.parametrize("widths", [(64, 32, 32), (48, 48), (16, 32, 16, 64)])
def test_the_joined_input_gradient_is_the_stacked_layers_on_both_branches(widths, monkeypatch):
    """fp8_joined_input_grad equals the input gradient of one layer with the weights stacked (two, three, or four
    parts: the fourth joins through an add), emulated and on the tensor-core branch (a stand-in for
    torch._scaled_mm on the CPU), whose stacked codes are transposed side by side into the shared buffer."""
    from lanner.kernels.quant import fp8 as fp8_module

    layers = [p.base.to(torch.bfloat16) for p in fp8_projections(widths, seed=12, bias=False)]
    douts = [wide_rows(20, n, seed=13 + i).bfloat16() for i, n in enumerate(widths)]
    emulated = fp8_module.fp8_joined_input_grad(layers, douts)
    if len(widths) <= 3:
        assert torch.equal(emulated, fp8_input_grad(stacked(layers), torch.cat(douts, dim=1)))
    if torch.cuda.is_available():
        return  # the real torch._scaled_mm: test_scaled_mm_matches_the_emulation
    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    monkeypatch.setattr(fp8_module, "fp8_backend", lambda device: "scaled_mm")
    assert torch.equal(fp8_module.fp8_joined_input_grad(layers, douts), emulated)


def test_the_mlp_backward_transposes_down_s_codes_once_for_all_its_dh_tiles(monkeypatch):
    """The MLP backward builds dh in row tiles (dh_tile_rows); over an FP8 down projection on the tensor-core
    branch (a stand-in for torch._scaled_mm on the CPU) W^T's codes are transposed once for all the tiles, not once
    a tile; a product that wrote the shared buffer between them would have the next tile transpose again. The
    gradients are those of one tile."""
    from lanner.kernels.quant import fp8 as fp8_module

    if torch.cuda.is_available():
        pytest.skip("the stand-in for torch._scaled_mm is the CPU's (test_scaled_mm_matches_the_emulation on a GPU)")
    monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
    monkeypatch.setattr(fp8_module, "fp8_backend", lambda device: "scaled_mm")
    transposed = []
    transpose = fp8_module.transpose_into
    monkeypatch.setattr(fp8_module, "transpose_into", lambda x, out: transposed.append(x.shape) or transpose(x, out))
    g = torch.Generator().manual_seed(4)

    def projection(n_in, n_out):
        base = FP8Linear.from_linear(torch.nn.Linear(n_in, n_out, bias=False)).to(torch.bfloat16)
        return lora.LoRAProjection(base, torch.randn(4, n_in, generator=g).bfloat16(),
                                   torch.randn(n_out, 4, generator=g).bfloat16(), 0.5)

    projections = (projection(64, 128), projection(64, 128), projection(128, 64))
    x = wide_rows(24, 64, seed=5).bfloat16()
    dout = wide_rows(24, 64, seed=6).bfloat16()
    grads = {}
    for dh_tile_rows in (None, 8):
        transposed.clear()
        xr = x.clone().requires_grad_()
        lora.lora_mlp(xr, *projections, "silu", dh_tile_rows=dh_tile_rows).backward(dout)
        grads[dh_tile_rows] = xr.grad
        assert transposed == [(64, 128), (128, 64), (128, 64)]  # down's once, then gate's and up's side by side
    assert torch.equal(grads[8], grads[None])
    product = fp8_module.fp8_repeated_input_grad(projections[2].base)
    transposed.clear()
    product(dout[:8]), product(dout[8:16])
    fp8_module.fp8_input_grad(projections[0].base, wide_rows(8, 128, seed=7).bfloat16())  # takes the buffer over
    product(dout[16:])
    assert transposed == [(64, 128), (128, 64), (64, 128)]


# (24, 16, 16): k/v-wide parts several rows to a program; (300, 1040): a block narrower than the widest part;
# (4200, 4200): parts past half a tile, in quarter-tile blocks (gate's and up's)
@pytest.mark.parametrize("widths", [(64, 16, 16), (300, 1040), (5,), (4200, 4200)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_joined_quantiser_gives_the_codes_of_the_joined_rows_bit_for_bit(widths, dtype, device):
    from lanner.kernels.ops.fp8_matmul import quantize_joined_rows_triton, quantize_rows_torch

    parts = [wide_rows(37, n + 8, seed=20 + i).to(device=device, dtype=dtype)[:, :n] for i, n in enumerate(widths)]
    parts[0][2] = 0
    parts[-1][4, -1] = -1000 * parts[0][4].abs().max()  # the row's largest in the last part
    for part in parts[1:]:
        part[2] = 0
    scales = [torch.rand(n, device=device) + 0.5 for n in widths]
    codes, scale = quantize_joined_rows_triton(parts, scales)
    expected_codes, expected_scale = quantize_rows_torch(torch.cat(parts, dim=1), torch.cat(scales))
    assert torch.equal(scale, expected_scale)
    assert torch.equal(codes.view(torch.uint8), expected_codes.view(torch.uint8))
    row_amax = part_maxima(torch.cat(parts, dim=1).float() * torch.cat(scales), 5)
    codes, scale = quantize_joined_rows_triton(parts, scales, row_amax)
    assert torch.equal(scale, expected_scale)
    assert torch.equal(codes.view(torch.uint8), expected_codes.view(torch.uint8))


def test_the_transposed_buffer_is_reserved_for_the_largest_product_before_backward(monkeypatch, device):
    """The memory engine plans from what is allocated before the first backward: the buffer of transposed codes is
    reserved then, sized for gate and up together (the largest joined product here), and backward's products on the
    tensor-core branch (the real torch._scaled_mm on an FP8 GPU, a stand-in on the CPU) write into it without
    growing it."""
    from lanner.kernels.quant import fp8 as fp8_module
    from lanner.kernels.quant.quantised_linear import release_buffers, shared_buffers

    if device != "cpu" and not fp8_gpu():
        pytest.skip("the tensor-core branch needs FP8 tensor cores (CUDA compute capability 8.9 or newer)")
    model = fp8_model(device=device)
    release_buffers()
    fp8_module.reserve_transposed_buffer(model)
    (reserved,) = shared_buffers()
    assert reserved.dtype == torch.uint8 and reserved.numel() == 2 * 128 * 64  # gate + up, each 128 x 64
    if device == "cpu":
        monkeypatch.setattr(torch, "_scaled_mm", fake_scaled_mm)
        monkeypatch.setattr(fp8_module, "fp8_backend", lambda device: "scaled_mm")
    randomise_lora(model)
    step_grads(model, token_batches(1, 2, 6, model.config.vocab_size, device=device)[0])
    assert [b.data_ptr() for b in shared_buffers()] == [reserved.data_ptr()]
    release_buffers()


def test_the_glu_kernel_finds_the_row_maxima_the_mlp_s_fp8_quantisers_read(monkeypatch):
    """Over FP8 bases the MLP's GLU backward finds the row maxima of gate's and up's gradients times their column
    scales, so that the quantiser of their joined input gradient reads each row once: the gradients are those of a
    quantiser that finds the maxima itself, bit for bit (the GLU in dh tiles: each fills its rows' maxima)."""
    from lanner.kernels.ops import fp8_matmul as ops

    g = torch.Generator().manual_seed(8)

    def projection(n_in, n_out):
        base = FP8Linear.from_linear(torch.nn.Linear(n_in, n_out, bias=False)).to(torch.bfloat16)
        return lora.LoRAProjection(base, torch.randn(4, n_in, generator=g).bfloat16(),
                                   torch.randn(n_out, 4, generator=g).bfloat16(), 0.5)

    projections = (projection(64, 272), projection(64, 272), projection(272, 64))  # ragged GLU tiles
    x, dout = wide_rows(24, 64, seed=9).bfloat16(), wide_rows(24, 64, seed=10).bfloat16()
    given = []
    quantize_rows_torch = ops.quantize_rows_torch
    monkeypatch.setattr(ops, "quantize_rows_torch",
                        lambda x, scale=None, row_amax=None: given.append(row_amax is not None and x.shape[1])
                        or quantize_rows_torch(x, scale, row_amax))
    results = []
    for row_amax_scale in (lambda layer: layer.fp8.scale, None):
        matmul = lora._BASE_MATMULS[FP8Linear]
        monkeypatch.setitem(lora._BASE_MATMULS, FP8Linear, lora.BaseMatmul(
            matmul.forward, matmul.input_grad, matmul.joined_input_grad, matmul.repeated_input_grad, row_amax_scale))
        given.clear()
        xr = x.clone().requires_grad_()
        weights = [w.clone().requires_grad_() for p in projections for w in p.lora_weights]
        out = lora.LoRAMLPFunction.apply(xr, torch.bfloat16, "silu", tuple(
            lora.LoRAProjection(p.base, a, b, p.scaling) for p, a, b in zip(projections, weights[::2], weights[1::2])),
            None, True, None, 8, None, None, *weights)
        out.backward(dout)
        results.append([out, xr.grad, *(w.grad for w in weights)])
        if row_amax_scale is not None:  # gate's and up's 544 columns
            assert [n for n in given if n] == [544]
    for got, expected in zip(*results):
        assert torch.equal(got, expected)
