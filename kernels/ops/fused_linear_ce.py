"""Cross entropy of a linear layer's output (lm_head) without materialising the (N, V) logits.

Tokens are processed in chunks. For each chunk: logits = hidden @ W^T (+ bias) by cuBLAS; then one
Triton program per row computes, in float32, the log-sum-exp, the row's loss and, in place over the
logits, d(loss)/d(logits) = (softmax - onehot) * scale; then dHidden = dLogits @ W (and dW, dBias
when they require grad) is accumulated at once. The forward therefore leaves the finished input
gradients behind, and backward only multiplies them by grad_output (the Liger-Kernel approach).

Normalisation, as in transformers' ForCausalLMLoss: mean over tokens whose label is not
ignore_index when num_items_in_batch is None (with every label ignored this is 0/0 = NaN, as in
torch.nn.functional.cross_entropy; the gradients are then 0), else sum / num_items_in_batch (with
every label ignored, or num_items_in_batch == 0, the loss is 0). The scale lives in a device tensor
so that no host synchronisation is needed. Labels outside [0, V) other than ignore_index are not
checked. The softcap is applied in float32 to the (compute-dtype) logits, where Gemma 2 in HF runs
its three softcap ops in the model dtype; the difference is within that dtype's rounding.
"""
import torch
import triton
import triton.language as tl

from ._utils import new_output, num_warps_for, tanh

# Largest vocabulary block one program holds at once; rows longer than that are looped over.
MAX_BLOCK_SIZE = 32768


@triton.jit
def _softcapped(x, softcap, HAS_SOFTCAP: tl.constexpr):
    if HAS_SOFTCAP:
        x = softcap * tanh(x / softcap)
    return x


@triton.jit
def _cross_entropy_kernel(
    LOGITS, LABELS, LOSS, SCALE,
    stride_logits,
    n_cols, ignore_index, softcap,
    HAS_SOFTCAP: tl.constexpr,
    COMPUTE_GRAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    LOGITS += row * stride_logits
    label = tl.load(LABELS + row)
    cols = tl.arange(0, BLOCK_SIZE)

    if label == ignore_index:
        tl.store(LOSS + row, 0.0)
        if COMPUTE_GRAD:
            for start in range(0, n_cols, BLOCK_SIZE):
                tl.store(LOGITS + start + cols, tl.zeros((BLOCK_SIZE,), dtype=tl.float32).to(LOGITS.dtype.element_ty),
                         mask=start + cols < n_cols)
        return

    # Pass 1: online log-sum-exp over the row.
    running_max = -float("inf")
    running_sum = 0.0
    for start in range(0, n_cols, BLOCK_SIZE):
        mask = start + cols < n_cols
        x = tl.load(LOGITS + start + cols, mask=mask, other=0.0).to(tl.float32)
        x = tl.where(mask, _softcapped(x, softcap, HAS_SOFTCAP), -float("inf"))
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
        running_max = new_max
    lse = running_max + tl.log(running_sum)

    target = _softcapped(tl.load(LOGITS + label).to(tl.float32), softcap, HAS_SOFTCAP)
    tl.store(LOSS + row, lse - target)

    # Pass 2: overwrite the logits with the gradient of scale * loss.
    if COMPUTE_GRAD:
        scale = tl.load(SCALE)
        for start in range(0, n_cols, BLOCK_SIZE):
            mask = start + cols < n_cols
            x = tl.load(LOGITS + start + cols, mask=mask, other=0.0).to(tl.float32)
            z = _softcapped(x, softcap, HAS_SOFTCAP)
            grad = tl.exp(z - lse) - tl.where(start + cols == label, 1.0, 0.0)
            if HAS_SOFTCAP:
                t = z / softcap
                grad = grad * (1.0 - t * t)
            tl.store(LOGITS + start + cols, (grad * scale).to(LOGITS.dtype.element_ty), mask=mask)


# Rows of a chunk when Liger's choice gives fewer: with a large vocabulary over a small hidden size that is
# ~128 rows, a GEMM too flat for the tensor cores' tiles (Qwen3-30B-A3B's head ran at 470 TFLOP/s on the H200,
# 6% of its step). Up to 1,024 rows as long as the chunk's logits stay within 256 MiB.
_MIN_CHUNK_ROWS = 1024
_MIN_CHUNK_LOGITS_BYTES = 256 * 2**20


def _default_chunk_size(n_rows, vocab, hidden, element_size):
    # Liger's choice: the logits chunk is about as large as hidden, so peak memory stays ~2x hidden.
    liger = triton.next_power_of_2(triton.cdiv(n_rows, triton.cdiv(vocab, hidden)))
    within = _MIN_CHUNK_LOGITS_BYTES // (element_size * vocab)  # rows whose logits fit the bound
    floor = min(_MIN_CHUNK_ROWS, 1 << max(0, within.bit_length() - 1))  # as a power of two
    return max(liger, floor)


def work_bytes(n_rows, vocab, hidden_size, element_size) -> int:
    """What the loss allocates beyond its input on a batch of n_rows: one chunk's logits, the input gradient and
    the rows' losses."""
    chunk = min(_default_chunk_size(n_rows, vocab, hidden_size, element_size), n_rows)
    return chunk * vocab * element_size + n_rows * hidden_size * element_size + n_rows * 4


def _compute_dtype(hidden, weight):
    if torch.is_autocast_enabled(hidden.device.type):
        return torch.get_autocast_dtype(hidden.device.type)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _loss_scale(labels, ignore_index, num_items_in_batch):
    """1 / denominator as a float32 device tensor (0 when a given num_items_in_batch is 0)."""
    if num_items_in_batch is None:
        count = (labels != ignore_index).sum().to(torch.float32)
        return 1.0 / count
    count = torch.as_tensor(num_items_in_batch, device=labels.device).to(torch.float32)
    return torch.where(count > 0, 1.0 / count, torch.zeros_like(count))


def _fused_linear_cross_entropy_forward(
    hidden, weight, labels, bias, ignore_index, num_items_in_batch, softcap, chunk_size,
    need_grad_hidden, need_grad_weight, need_grad_bias,
):
    n_rows, hidden_size = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    compute_grad = need_grad_hidden or need_grad_weight or need_grad_bias
    compute_dtype = _compute_dtype(hidden, weight)
    hidden_c = hidden.to(compute_dtype)
    weight_c = weight.to(compute_dtype)
    bias_c = None if bias is None else bias.to(compute_dtype)
    labels = labels.contiguous()

    scale = _loss_scale(labels, ignore_index, num_items_in_batch)
    loss_rows = new_output((n_rows,), torch.float32, device)
    grad_hidden = new_output((n_rows, hidden_size), hidden.dtype, device) if need_grad_hidden else None
    # dW is accumulated chunk by chunk with addmm_ in the compute dtype: cuBLAS sums each chunk in
    # float32, and a float32 copy of a (V, H) matrix (2 GiB for Llama-3 8B) would cost more than the
    # one rounding per chunk. dBias is small, so it is summed in float32.
    grad_weight = torch.zeros((vocab, hidden_size), dtype=compute_dtype, device=device) if need_grad_weight else None
    grad_bias = torch.zeros((vocab,), dtype=torch.float32, device=device) if need_grad_bias else None

    chunk_size = chunk_size or _default_chunk_size(n_rows, vocab, hidden_size, compute_dtype.itemsize)
    block = min(triton.next_power_of_2(vocab), MAX_BLOCK_SIZE)
    # One buffer for every chunk's logits: a chunk's own would be made while the previous one's is still held.
    logits_buffer = torch.empty((min(chunk_size, n_rows), vocab), dtype=compute_dtype, device=device)
    with torch.autocast(device_type=device.type, enabled=False):
        for start in range(0, n_rows, chunk_size):
            end = min(start + chunk_size, n_rows)
            hidden_chunk = hidden_c[start:end]
            logits = logits_buffer[:end - start]
            if bias_c is None:
                torch.mm(hidden_chunk, weight_c.t(), out=logits)
            else:
                torch.addmm(bias_c, hidden_chunk, weight_c.t(), out=logits)
            _cross_entropy_kernel[(end - start,)](
                logits, labels[start:end], loss_rows[start:end], scale,
                logits.stride(0),
                vocab, ignore_index, float(softcap) if softcap is not None else 1.0,
                HAS_SOFTCAP=softcap is not None,
                COMPUTE_GRAD=compute_grad,
                BLOCK_SIZE=block,
                num_warps=num_warps_for(block),
            )
            if not compute_grad:
                continue
            grad_logits = logits
            if need_grad_hidden:
                if grad_hidden.dtype == compute_dtype:
                    torch.mm(grad_logits, weight_c, out=grad_hidden[start:end])
                else:
                    grad_hidden[start:end] = grad_logits @ weight_c
            if need_grad_weight:
                grad_weight.addmm_(grad_logits.t(), hidden_chunk)
            if need_grad_bias:
                grad_bias += grad_logits.sum(0, dtype=torch.float32)

    loss = loss_rows.sum() * scale
    if grad_weight is not None:
        grad_weight = grad_weight.to(weight.dtype)
    if grad_bias is not None:
        grad_bias = grad_bias.to(bias.dtype)
    return loss, grad_hidden, grad_weight, grad_bias


class FusedLinearCrossEntropyFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, bias, ignore_index, num_items_in_batch, softcap, chunk_size, needs):
        loss, grad_hidden, grad_weight, grad_bias = _fused_linear_cross_entropy_forward(
            hidden, weight, labels, bias, ignore_index, num_items_in_batch, softcap, chunk_size, *needs
        )
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.backward_done = False
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.backward_done:
            raise RuntimeError("fused_linear_cross_entropy: backward through the same loss twice is not supported")
        ctx.backward_done = True
        # The gradients were finished in forward; scale them in place (they are not used again).
        grads = [None if g is None else g.mul_(grad_output) for g in ctx.saved_tensors]
        grad_hidden, grad_weight, grad_bias = grads
        return grad_hidden, grad_weight, None, grad_bias, None, None, None, None, None


def fused_linear_cross_entropy(
    hidden, weight, labels, bias=None, ignore_index=-100, num_items_in_batch=None, softcap=None, chunk_size=None
):
    """Scalar cross-entropy loss of hidden (N, H) @ weight (V, H)^T (+ bias) against labels (N,).

    Labels are already shifted. The (N, V) logits are never materialised (chunks of chunk_size rows
    at a time; the default keeps a chunk's logits about the size of hidden, or at least
    512-1,024 rows within 256 MiB). softcap applies Gemma 2's
    final_logit_softcapping, softcap * tanh(logits / softcap). See the module docstring for the
    normalisation and the all-ignored case. Gradients are computed during forward when grad mode is
    on and an input requires grad; dW and dBias only when weight / bias require grad.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or labels.shape != hidden.shape[:1] or weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"fused_linear_cross_entropy: expected hidden (N, H), weight (V, H), labels (N,); got "
            f"{tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(labels.shape)}"
        )
    grad_enabled = torch.is_grad_enabled()
    needs = (
        grad_enabled and hidden.requires_grad,
        grad_enabled and weight.requires_grad,
        grad_enabled and bias is not None and bias.requires_grad,
    )
    return FusedLinearCrossEntropyFunction.apply(
        hidden, weight, labels, bias, int(ignore_index), num_items_in_batch, softcap, chunk_size, needs
    )
