"""Per-kernel timings on the Llama-3 8B shapes (8,192 tokens a step), against the device's ceilings.

    python benchmarks/kernels_bench.py            # on the GPU; prints a markdown table

Each row: median ms by triton.testing.do_bench, and the achieved bytes/s (memory-bound kernels:
each input read once, each output written once) or FLOP/s (matmul-bound ones), as a fraction of
the measured ceilings (device copy bandwidth and a large bf16 matmul, both measured here first).
"""
from __future__ import annotations

import torch
from torch import nn
from triton.testing import do_bench

from lanner.kernels import LoRAProjection, lora_linear, lora_mlp, lora_qkv
from lanner.kernels.ops.fused_linear_ce import fused_linear_cross_entropy
from lanner.kernels.ops.glu import _glu_backward
from lanner.kernels.ops.rmsnorm import _rms_norm_backward, rms_norm
from lanner.kernels.ops.rope import _rope_launch

TOKENS, HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM, VOCAB, RANK = 8192, 4096, 14336, 32, 8, 128, 128256, 16
BF16 = torch.bfloat16


def median_ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=100, return_mode="median")


def ceilings() -> tuple[float, float]:
    """(bytes/s of a device-to-device copy counting read + write, FLOP/s of an 8192^3 bf16 matmul)."""
    src = torch.randn(2**30 // 2, device="cuda", dtype=BF16)
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src))
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=BF16) for _ in range(2))
    mm_ms = median_ms(lambda: a @ b)
    return 2 * src.numel() * 2 / (copy_ms * 1e-3), 2 * 8192**3 / (mm_ms * 1e-3)


def projection(out_features: int, in_features: int) -> LoRAProjection:
    base = nn.Linear(in_features, out_features, bias=False, device="cuda", dtype=BF16).requires_grad_(False)
    A = (torch.randn(RANK, in_features, device="cuda") * 0.01).requires_grad_()
    B = (torch.randn(out_features, RANK, device="cuda") * 0.01).requires_grad_()
    return LoRAProjection(base, A, B, scaling=1.0)


def memory_rows():
    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=BF16)
    w = torch.randn(HIDDEN, device="cuda", dtype=BF16)
    x_grad = x.clone().requires_grad_()
    y = rms_norm(x_grad, w, 1e-5)
    dy = torch.randn_like(y)
    yield "rms_norm forward", median_ms(lambda: rms_norm(x, w, 1e-5)), 2 * x.numel() * 2, None
    yield ("rms_norm backward (frozen weight), through autograd",
           median_ms(lambda: torch.autograd.grad(y, x_grad, dy, retain_graph=True)), 3 * x.numel() * 2, None)
    rstd = torch.rand(TOKENS, device="cuda", dtype=torch.float32) + 0.5
    yield ("rms_norm backward kernel alone",
           median_ms(lambda: _rms_norm_backward(dy, x, w, rstd, 0.0, True, compute_dw=False)), 3 * x.numel() * 2, None)

    q = torch.randn(4, 2048, HEADS, HEAD_DIM, device="cuda", dtype=BF16).transpose(1, 2)
    k = torch.randn(4, 2048, KV_HEADS, HEAD_DIM, device="cuda", dtype=BF16).transpose(1, 2)
    cos, sin = (torch.randn(1, 2048, HEAD_DIM, device="cuda", dtype=BF16) for _ in range(2))
    yield ("rope forward (q and k in place)", median_ms(lambda: _rope_launch(q, k, cos, sin, inverse=False)),
           2 * (q.numel() + k.numel()) * 2, None)

    gate, up = (torch.randn(TOKENS, INTERMEDIATE, device="cuda", dtype=BF16) for _ in range(2))
    dh = torch.randn_like(gate)
    from lanner.kernels.ops import swiglu
    yield "swiglu forward", median_ms(lambda: swiglu(gate, up)), 3 * gate.numel() * 2, None
    yield ("swiglu backward (in place)", median_ms(lambda: _glu_backward(dh, gate, up, "silu")),
           5 * gate.numel() * 2, None)


def matmul_rows():
    hidden = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=BF16).requires_grad_()
    head = torch.randn(VOCAB, HIDDEN, device="cuda", dtype=BF16) * 0.02
    labels = torch.randint(0, VOCAB, (TOKENS,), device="cuda")
    yield ("fused linear + CE (forward, computes dHidden)",
           median_ms(lambda: fused_linear_cross_entropy(hidden, head, labels)), None, 4 * TOKENS * HIDDEN * VOCAB)

    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=BF16).requires_grad_()
    gate, up, down = projection(INTERMEDIATE, HIDDEN), projection(INTERMEDIATE, HIDDEN), projection(HIDDEN, INTERMEDIATE)
    mlp_flops = 3 * 2 * TOKENS * HIDDEN * INTERMEDIATE
    dout = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=BF16)
    with torch.no_grad():
        yield "LoRA MLP forward", median_ms(lambda: lora_mlp(x, gate, up, down, "silu")), None, mlp_flops
        yield ("LoRA MLP recompute (down GEMM skipped)",
               median_ms(lambda: lora_mlp(x, gate, up, down, "silu", output_needed=False)), None, mlp_flops * 2 / 3)
    yield ("LoRA MLP forward + backward",
           median_ms(lambda: lora_mlp(x, gate, up, down, "silu").backward(dout)), None, 2 * mlp_flops)

    q, k, v = projection(HEADS * HEAD_DIM, HIDDEN), projection(KV_HEADS * HEAD_DIM, HIDDEN), projection(KV_HEADS * HEAD_DIM, HIDDEN)
    qkv_flops = 2 * TOKENS * HIDDEN * (HEADS + 2 * KV_HEADS) * HEAD_DIM

    def qkv_step():
        outs = lora_qkv(x, q, k, v)
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    yield "LoRA q/k/v forward + backward", median_ms(qkv_step), None, 2 * qkv_flops
    o = projection(HIDDEN, HEADS * HEAD_DIM)
    yield ("LoRA o_proj forward + backward", median_ms(lambda: lora_linear(x, o).backward(dout)), None,
           2 * 2 * TOKENS * HIDDEN * HIDDEN)

    a = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=BF16)
    w = torch.randn(INTERMEDIATE, HIDDEN, device="cuda", dtype=BF16)
    yield "reference: cuBLAS x @ W_gate^T", median_ms(lambda: a @ w.t()), None, 2 * TOKENS * HIDDEN * INTERMEDIATE


def host_copy_rows():
    """The memory engine's offload traffic: one 8B layer input (64 MiB) to pinned host memory and back."""
    x = torch.randn(TOKENS, HIDDEN, device="cuda", dtype=BF16)
    host = torch.empty(x.shape, dtype=BF16, pin_memory=True)
    nbytes = x.numel() * 2
    yield "offload: layer input to pinned host (64 MiB)", median_ms(lambda: host.copy_(x, non_blocking=True)), nbytes
    yield "offload: layer input back to the GPU (64 MiB)", median_ms(lambda: x.copy_(host, non_blocking=True)), nbytes


def main():
    bandwidth, flops = ceilings()
    print(f"ceilings here: copy {bandwidth / 1e12:.2f} TB/s, bf16 matmul {flops / 1e12:.0f} TFLOP/s")
    print("| kernel (8B shapes, 8,192 tokens) | median ms | achieved | of ceiling |")
    print("|---|---|---|---|")
    for name, ms, nbytes, nflops in [*memory_rows(), *matmul_rows()]:
        if nbytes is not None:
            rate = nbytes / (ms * 1e-3)
            print(f"| {name} | {ms:.3f} | {rate / 1e12:.2f} TB/s | {rate / bandwidth:.0%} of copy |", flush=True)
        else:
            rate = nflops / (ms * 1e-3)
            print(f"| {name} | {ms:.3f} | {rate / 1e12:.0f} TFLOP/s | {rate / flops:.0%} of matmul |", flush=True)
    for name, ms, nbytes in host_copy_rows():
        print(f"| {name} | {ms:.3f} | {nbytes / (ms * 1e-3) / 1e9:.1f} GB/s | host link |", flush=True)


if __name__ == "__main__":
    main()
