"""The FP8 base GEMMs on their own (docs/fp8.md), on the Llama-3 8B projection shapes at 8,192 tokens:
time of the bf16 GEMM, of FP8Linear's forward product (per-token quantisation + torch._scaled_mm; a fresh
view of x each call, so the cached quantisation of rows shared by projections is not reused) and of its
input gradient (scaling, quantisation, the transposed codes + torch._scaled_mm); each part alone (the
quantiser and the transpose with their bandwidth, the GEMM with and without fast accumulation); and the
tensor cores' result against the float32 emulation (max error relative to the largest element), with
use_fast_accum off (the training path) and on; then the input gradient of q/k/v and of gate/up as one joined
product against one product per projection added into dX.

    python benchmarks/fp8_gemm.py [--tokens 8192]     # CUDA, compute capability 8.9 or newer

lanner.kernels must be importable (run.py's way: a folder with lanner/kernels -> this checkout's kernels/).
"""
from __future__ import annotations

import argparse
import json
import os

SHAPES = {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate/up": (14336, 4096), "down": (4096, 14336)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=8192)
    args = parser.parse_args()
    import torch
    from triton.testing import do_bench

    from lanner.kernels.ops.fp8_matmul import fp8_matmul, quantize_rows, transpose_into
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
        transposed = torch.empty(in_features, out_features, device="cuda", dtype=torch.uint8)

        def fast_accum():
            return torch._scaled_mm(xq, fp8.e4m3.t(), scale_a=xs, scale_b=fp8.scale.view(1, -1),
                                    out_dtype=torch.bfloat16, use_fast_accum=True)

        def relative(out):
            return ((out.float() - emulated).abs().max() / emulated.abs().max()).item()

        gpu = fp8_matmul(xq, xs, fp8.e4m3, fp8.scale, torch.bfloat16, "scaled_mm").float()
        emulated = fp8_matmul(xq, xs, fp8.e4m3, fp8.scale, torch.float32, "emulated")
        gemms = {
            "bf16_forward_ms": do_bench(lambda: x @ weight.t()),
            "fp8_forward_ms": do_bench(lambda: fp8_forward(layer, x.view(x.shape))),
            "fp8_gemm_only_ms": do_bench(lambda: fp8_matmul(xq, xs, fp8.e4m3, fp8.scale, torch.bfloat16, "scaled_mm")),
            "fp8_gemm_fast_accum_ms": do_bench(fast_accum),
            "bf16_input_grad_ms": do_bench(lambda: dout @ weight),
            "fp8_input_grad_ms": do_bench(lambda: fp8_input_grad(layer, dout)),
        }
        parts = {
            "quantize_x_ms": do_bench(lambda: quantize_rows(x)),
            "quantize_dout_ms": do_bench(lambda: quantize_rows(dout, fp8.scale)),
            "transpose_ms": do_bench(lambda: transpose_into(fp8.codes, transposed)),
        }
        flops = 2 * args.tokens * in_features * out_features
        tflops = {key.replace("_ms", "_tflops"): round(flops / (ms * 1e-3) / 1e12) for key, ms in gemms.items()}
        moved = {"quantize_x_ms": x.numel() * 3, "quantize_dout_ms": dout.numel() * 3,  # bf16 in, e4m3 out
                 "transpose_ms": 2 * fp8.codes.numel()}
        gbps = {key.replace("_ms", "_gbps"): round(moved[key] / (ms * 1e-3) / 1e9) for key, ms in parts.items()}
        dense = (x.float() @ layer.dense_weight(torch.float32).t())
        print(json.dumps(dict(shape=name, tokens=args.tokens,
                              **{k: round(v, 3) for k, v in {**gemms, **parts}.items()}, **tflops, **gbps,
                              scaled_mm_vs_emulation=relative(gpu), fast_accum_vs_emulation=relative(fast_accum()),
                              fp8_vs_bf16_activations=((emulated - dense).abs().max() / dense.abs().max()).item(),
                              gpu=torch.cuda.get_device_name())), flush=True)
    joined(args.tokens, do_bench)


def joined(tokens: int, do_bench) -> None:
    """dX of projections reading the same rows (q/k/v, gate/up): one FP8 product per projection with each
    further one added into dX (as before fp8_joined_input_grad) against the one joined product; the joined
    product with float32 and with fast accumulation, time and error against the emulation."""
    import torch

    from lanner.kernels.ops import fp8_matmul as fp8_matmul_module
    from lanner.kernels.quant import FP8Linear
    from lanner.kernels.quant import fp8 as fp8_module
    from lanner.kernels.quant.fp8 import fp8_input_grad, fp8_joined_input_grad

    default = fp8_module.INPUT_GRAD_FAST_ACCUM
    for name, widths in {"q/k/v": (4096, 1024, 1024), "gate/up": (14336, 14336)}.items():
        layers = [FP8Linear.from_linear(torch.nn.Linear(4096, n, bias=False, device="cuda", dtype=torch.bfloat16))
                  for n in widths]
        douts = [torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16) for n in widths]

        def separate():
            dx = fp8_input_grad(layers[0], douts[0])
            for layer, dout in zip(layers[1:], douts[1:]):
                dx.add_(fp8_input_grad(layer, dout))
            return dx

        def joined_product(fast_accum: bool):
            fp8_module.INPUT_GRAD_FAST_ACCUM = fast_accum
            return fp8_joined_input_grad(layers, douts)

        def error(out):
            return ((out.float() - emulated).abs().max() / emulated.abs().max()).item()

        os.environ[fp8_matmul_module.EMULATE_ENV] = "1"  # the float32 sums of the same codes and scales
        emulated = fp8_joined_input_grad(layers, douts).float()
        del os.environ[fp8_matmul_module.EMULATE_ENV]
        one = joined_product(False).float()
        row = dict(group=name, tokens=tokens, separate_ms=round(do_bench(separate), 3),
                   joined_vs_separate=((one - separate().float()).abs().max() / one.abs().max()).item(),
                   joined_ms=round(do_bench(lambda: joined_product(False)), 3), joined_vs_emulation=error(one),
                   joined_fast_accum_ms=round(do_bench(lambda: joined_product(True)), 3),
                   joined_fast_accum_vs_emulation=error(joined_product(True)), gpu=torch.cuda.get_device_name())
        print(json.dumps(row), flush=True)
        fp8_module.INPUT_GRAD_FAST_ACCUM = default


if __name__ == "__main__":
    main()
