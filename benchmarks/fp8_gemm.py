"""The FP8 base GEMMs on their own (docs/fp8.md), on the Llama-3 8B projection shapes at 8,192 tokens:
time of the bf16 GEMM, of FP8Linear's forward product (per-token quantisation + torch._scaled_mm) and of its
input gradient (scaling, quantisation, the transposed copy + torch._scaled_mm), and the tensor cores'
result against the float32 emulation (max error relative to the largest element).

    python benchmarks/fp8_gemm.py [--tokens 8192]     # CUDA, compute capability 8.9 or newer

lanner.kernels must be importable (run.py's way: a folder with lanner/kernels -> this checkout's kernels/).
"""
from __future__ import annotations

import argparse
import json

SHAPES = {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate/up": (14336, 4096), "down": (4096, 14336)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args()
    import torch
    from triton.testing import do_bench

    from lanner.kernels.ops.fp8_matmul import fp8_matmul, quantize_rows
    from lanner.kernels.quant import FP8Linear
    from lanner.kernels.quant.fp8 import fp8_forward, fp8_input_grad

    torch.manual_seed(0)
    for name, (out_features, in_features) in SHAPES.items():
        linear = torch.nn.Linear(in_features, out_features, bias=False, device="cuda", dtype=torch.bfloat16)
        layer = FP8Linear.from_linear(linear)
        x = torch.randn(args.tokens, in_features, device="cuda", dtype=torch.bfloat16)
        dout = torch.randn(args.tokens, out_features, device="cuda", dtype=torch.bfloat16)
        weight = linear.weight
        xq, xs = quantize_rows(x)
        fp8 = layer.fp8
        gpu = fp8_matmul(xq, xs, fp8.e4m3, fp8.scale, torch.bfloat16, "scaled_mm").float()
        emulated = fp8_matmul(xq, xs, fp8.e4m3, fp8.scale, torch.float32, "emulated")
        flops = 2 * args.tokens * in_features * out_features
        times = {
            "bf16_forward_ms": do_bench(lambda: x @ weight.t()),
            "fp8_forward_ms": do_bench(lambda: fp8_forward(layer, x)),
            "fp8_gemm_only_ms": do_bench(lambda: fp8_matmul(xq, xs, fp8.e4m3, fp8.scale, torch.bfloat16, "scaled_mm")),
            "bf16_input_grad_ms": do_bench(lambda: dout @ weight),
            "fp8_input_grad_ms": do_bench(lambda: fp8_input_grad(layer, dout)),
        }
        tflops = {key.replace("_ms", "_tflops"): round(flops / (ms * 1e-3) / 1e12) for key, ms in times.items()}
        dense = (x.float() @ layer.dense_weight(torch.float32).t())
        print(json.dumps(dict(shape=name, tokens=args.tokens, **{k: round(v, 3) for k, v in times.items()}, **tflops,
                              scaled_mm_vs_emulation=((gpu - emulated).abs().max() / emulated.abs().max()).item(),
                              fp8_vs_bf16_activations=((emulated - dense).abs().max() / dense.abs().max()).item(),
                              gpu=torch.cuda.get_device_name())), flush=True)


if __name__ == "__main__":
    main()
