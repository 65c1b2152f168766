import math

import pytest
import torch
import torch.nn.functional as F
import triton

from lanner.kernels.ops import fused_linear_cross_entropy
from lanner.kernels.ops import fused_linear_ce as ce_module

# Against float64 cross entropy on materialised logits. float32: the matmuls and the log-sum-exp
# in float32 (relative 1e-5). bfloat16: the logits and the gradient of the logits are rounded to
# bf16 (as HF's bf16 lm_head output is), then bf16 matmuls: about 1e-2 of the largest element.
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def _problem(n_rows, hidden_size, vocab, dtype, device, ignored=(), weight_grad=False, with_bias=False):
    hidden = torch.randn(n_rows, hidden_size, device=device).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, hidden_size, device=device) / math.sqrt(hidden_size) * 4).to(dtype)
    weight.requires_grad_(weight_grad)
    bias = torch.randn(vocab, device=device).to(dtype).requires_grad_() if with_bias else None
    labels = torch.randint(0, vocab, (n_rows,), device=device)
    labels[list(ignored)] = -100
    return hidden, weight, labels, bias


def _reference_fp64(hidden, weight, labels, bias, num_items_in_batch=None, softcap=None):
    """Loss and float64 gradients, computed as transformers' ForCausalLMLoss does on full logits."""
    h64 = hidden.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_(weight.requires_grad)
    b64 = None if bias is None else bias.detach().double().requires_grad_()
    logits = F.linear(h64, w64, b64)
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)
    if num_items_in_batch is None:
        loss = F.cross_entropy(logits, labels, ignore_index=-100)
    else:
        loss = F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum") / num_items_in_batch
    return loss, h64, w64, b64


def _check(hidden, weight, bias, loss, ref, tol, assert_close_scaled, grad_output=1.0):
    ref_loss, h64, w64, b64 = ref
    assert loss.dim() == 0 and loss.dtype == torch.float32
    torch.testing.assert_close(loss.double(), ref_loss.detach(), rtol=tol, atol=tol)
    loss.backward(torch.tensor(grad_output, device=loss.device))
    (ref_loss * grad_output).backward()
    assert hidden.grad.dtype == hidden.dtype
    assert_close_scaled(hidden.grad, h64.grad, tol)
    if weight.requires_grad:
        assert weight.grad.dtype == weight.dtype
        assert_close_scaled(weight.grad, w64.grad, tol)
    else:
        assert weight.grad is None
    if bias is not None:
        assert_close_scaled(bias.grad, b64.grad, tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("weight_grad", [False, True], ids=["weight_frozen", "weight_grad"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("chunk_size", [None, 4], ids=["chunk_default", "chunk_4"])
def test_matches_torch_cross_entropy(dtype, weight_grad, with_bias, chunk_size, device, assert_close_scaled):
    hidden, weight, labels, bias = _problem(11, 48, 97, dtype, device, ignored=(0, 6), weight_grad=weight_grad,
                                            with_bias=with_bias)
    loss = fused_linear_cross_entropy(hidden, weight, labels, bias=bias, chunk_size=chunk_size)
    _check(hidden, weight, bias, loss, _reference_fp64(hidden, weight, labels, bias), TOL[dtype],
           assert_close_scaled)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("as_tensor", [False, True], ids=["int", "tensor"])
def test_num_items_in_batch(dtype, as_tensor, device, assert_close_scaled):
    # Gradient accumulation: the sum over this micro-batch divided by the tokens of the whole batch.
    hidden, weight, labels, _ = _problem(9, 40, 130, dtype, device, ignored=(3,), weight_grad=True)
    num_items = torch.tensor(23, device=device) if as_tensor else 23
    loss = fused_linear_cross_entropy(hidden, weight, labels, num_items_in_batch=num_items, chunk_size=3)
    _check(hidden, weight, None, loss, _reference_fp64(hidden, weight, labels, None, num_items_in_batch=23),
           TOL[dtype], assert_close_scaled, grad_output=0.25)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softcap(dtype, device, assert_close_scaled):
    hidden, weight, labels, bias = _problem(7, 36, 101, dtype, device, ignored=(5,), weight_grad=True,
                                            with_bias=True)
    with torch.no_grad():
        weight.mul_(4)  # logits well beyond the cap, where tanh saturates
    loss = fused_linear_cross_entropy(hidden, weight, labels, bias=bias, softcap=5.0)
    _check(hidden, weight, bias, loss, _reference_fp64(hidden, weight, labels, bias, softcap=5.0), TOL[dtype],
           assert_close_scaled)


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_vocab_longer_than_one_block(softcap, monkeypatch, device, assert_close_scaled):
    # Rows longer than a block are reduced with the online log-sum-exp loop; 300 = 4 blocks of 64 + a tail.
    monkeypatch.setattr(ce_module, "MAX_BLOCK_SIZE", 64)
    hidden, weight, labels, _ = _problem(6, 32, 300, torch.float32, device, ignored=(1,), weight_grad=True)
    labels[2] = 299  # the label in the ragged last block
    loss = fused_linear_cross_entropy(hidden, weight, labels, softcap=softcap, chunk_size=4)
    _check(hidden, weight, None, loss, _reference_fp64(hidden, weight, labels, None, softcap=softcap), 1e-5,
           assert_close_scaled)


def test_single_token(device, assert_close_scaled):
    hidden, weight, labels, _ = _problem(1, 24, 50, torch.float32, device)
    loss = fused_linear_cross_entropy(hidden, weight, labels)
    _check(hidden, weight, None, loss, _reference_fp64(hidden, weight, labels, None), 1e-5, assert_close_scaled)


@pytest.mark.parametrize("as_tensor", [False, True], ids=["int", "tensor"])
def test_all_ignored_with_num_items_in_batch_is_zero(as_tensor, device):
    hidden, weight, labels, _ = _problem(5, 16, 40, torch.float32, device, ignored=range(5), weight_grad=True)
    num_items = torch.tensor(12, device=device) if as_tensor else 12
    loss = fused_linear_cross_entropy(hidden, weight, labels, num_items_in_batch=num_items, chunk_size=2)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.count_nonzero(hidden.grad) == 0 and torch.count_nonzero(weight.grad) == 0


def test_all_ignored_mean_follows_torch(device):
    # torch's mean over zero tokens is 0/0 = NaN; its gradient is zero everywhere, and so is ours.
    hidden, weight, labels, _ = _problem(4, 16, 40, torch.float32, device, ignored=range(4))
    loss = fused_linear_cross_entropy(hidden, weight, labels)
    ref_loss, h64, _, _ = _reference_fp64(hidden, weight, labels, None)
    assert torch.isnan(loss) and torch.isnan(ref_loss)
    loss.backward()
    ref_loss.backward()
    assert torch.count_nonzero(hidden.grad) == 0 and torch.count_nonzero(h64.grad) == 0


def test_num_items_in_batch_zero_gives_zero_loss(device):
    hidden, weight, labels, _ = _problem(3, 16, 40, torch.float32, device, ignored=range(3))
    loss = fused_linear_cross_entropy(hidden, weight, labels, num_items_in_batch=0)
    assert loss.item() == 0.0


def test_ragged_batch_with_ignored_rows(device, assert_close_scaled):
    # Packed/padded rows flattened: whole stretches of padding among real tokens, chunk not dividing N.
    hidden, weight, labels, _ = _problem(13, 20, 77, torch.float32, device, ignored=(0, 1, 2, 7, 12))
    loss = fused_linear_cross_entropy(hidden, weight, labels, chunk_size=5)
    _check(hidden, weight, None, loss, _reference_fp64(hidden, weight, labels, None), 1e-5, assert_close_scaled)


def test_custom_ignore_index(device):
    hidden, weight, labels, _ = _problem(6, 16, 30, torch.float32, device)
    labels[[1, 4]] = 7
    loss = fused_linear_cross_entropy(hidden, weight, labels, ignore_index=7)
    ref = F.cross_entropy(F.linear(hidden.detach().double(), weight.double()), labels, ignore_index=7)
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-5)


def test_no_grad_forward(device):
    hidden, weight, labels, _ = _problem(5, 16, 30, torch.float32, device, ignored=(2,))
    with torch.no_grad():
        loss = fused_linear_cross_entropy(hidden, weight, labels)
    ref_loss = _reference_fp64(hidden, weight, labels, None)[0]
    assert loss.grad_fn is None
    torch.testing.assert_close(loss.double(), ref_loss.detach(), rtol=1e-5, atol=1e-5)


def test_full_logits_are_never_materialised(monkeypatch, device):
    # Every logits tensor the op creates has at most chunk_size rows.
    seen_rows = []
    kernel = ce_module._cross_entropy_kernel

    class Spy:
        def __getitem__(self, grid):
            def launch(logits, *args, **kwargs):
                seen_rows.append(logits.shape[0])
                return kernel[grid](logits, *args, **kwargs)
            return launch

    monkeypatch.setattr(ce_module, "_cross_entropy_kernel", Spy())
    hidden, weight, labels, _ = _problem(10, 16, 30, torch.float32, device)
    fused_linear_cross_entropy(hidden, weight, labels, chunk_size=4).backward()
    assert seen_rows == [4, 4, 2]


def test_second_backward_is_refused(device):
    # The gradients are scaled in place by the first backward, so a second one would be wrong.
    hidden, weight, labels, _ = _problem(3, 16, 30, torch.float32, device)
    loss = fused_linear_cross_entropy(hidden, weight, labels)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        loss.backward()


@pytest.mark.parametrize("rows, vocab, hidden", [(8192, 151936, 2048), (8192, 256000, 3584), (8192, 128256, 4096),
                                                 (65536, 32000, 8192)])
@pytest.mark.parametrize("element_size", [2, 4], ids=["16-bit", "float32"])
def test_default_chunks_are_tall_enough_for_the_tensor_cores_within_their_memory(rows, vocab, hidden, element_size):
    chunk = ce_module._default_chunk_size(rows, vocab, hidden, element_size)
    liger = triton.next_power_of_2(triton.cdiv(rows, triton.cdiv(vocab, hidden)))
    assert chunk >= liger
    if element_size == 2:
        assert chunk >= 512 or chunk == liger  # not a ~128-row GEMM against the whole vocabulary
    assert chunk == liger or chunk * vocab * element_size <= 256 * 2**20


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA caching allocator's peak")
def test_the_loss_holds_one_chunk_of_logits_at_a_time():
    """Four chunks of 1,024 rows (62.5 MiB of logits each): the loss allocates what work_bytes says (one chunk's
    logits, the input gradient, the rows' losses), not two chunks at once, beyond allocator rounding."""
    n_rows, hidden_size, vocab = 4096, 256, 32000
    hidden, weight, labels, _ = _problem(n_rows, hidden_size, vocab, torch.bfloat16, "cuda")
    fused_linear_cross_entropy(hidden, weight, labels)  # (cuBLAS's workspace, Triton's compile)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fused_linear_cross_entropy(hidden, weight, labels)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - before <= ce_module.work_bytes(n_rows, vocab, hidden_size, 2) + 2**22
