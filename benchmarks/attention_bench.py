"""Our attention path on the GPU: correctness against a float32 reference, and forward + backward time.

    python benchmarks/attention_bench.py [--out results.json] [--quick]
    python benchmarks/attention_bench.py --tune-flex | --tune-triton | --sdpa-backends

Correctness: bf16 inputs, causal_attention (the dispatched path) against the dense float32 reference
of the same inputs (kernels/attention/core.py's reference), ||out - ref|| / ||ref|| for the output and
for dq, dk, dv; and float32 inputs the same way. Timing: triton.testing.do_bench medians of forward +
backward on the shapes of the benchmark grid, our path against what transformers ran before (SDPA with
the dense window mask it built) and against plain causal SDPA (the no-window lower bound).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F



def _import_lanner():
    try:
        from lanner.kernels.attention import core
    except ImportError:  # a checkout where lanner is not installed (the GPU machine): as run.py does
        from run import lanner_import_root
        sys.path.insert(0, str(lanner_import_root()))
        from lanner.kernels.attention import core
    return core


core = _import_lanner()


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def make(b, hq, hk, t, d, dtype):
    return [torch.randn(b, h, t, d, device="cuda", dtype=dtype).requires_grad_() for h in (hq, hk, hk)]


def segments_for(b, t, sample):
    ids = torch.arange(t, device="cuda") // sample
    return ids[None].expand(b, t).contiguous()


def left_padding(b, t, pad):
    mask = torch.ones(b, t, dtype=torch.bool, device="cuda")
    mask[-1, :pad] = False
    return mask


def check(name, shape, dtype, **options):
    b, hq, hk, t, d = shape
    q, k, v = make(b, hq, hk, t, d, dtype)
    scale = d ** -0.5
    out = core.causal_attention(q, k, v, scale=scale, **options)
    grad = torch.randn_like(out)
    padding = options.get("padding")
    if padding is not None:  # padding queries' outputs are never read
        grad = grad * padding[:, None, :, None]
    sinks = options.get("sinks")
    inputs = (q, k, v) if sinks is None else (q, k, v, sinks)
    got = torch.autograd.grad(out, inputs, grad)
    inputs32 = [x.detach().float().requires_grad_() for x in inputs]
    window = core.effective_window(options.get("window"), t)
    mask = core.dense_mask(t, window, padding, options.get("segments"), "cuda")
    ref = core._reference(*inputs32[:3], scale, mask, options.get("softcap"), *inputs32[3:])
    want = torch.autograd.grad(ref, inputs32, grad.float())
    rows = padding[:, None, :, None].expand_as(out) if padding is not None else torch.ones_like(out, dtype=torch.bool)
    backend = core.call_backend(q, window, options.get("softcap"), padding, options.get("segments"), sinks)
    names = ("dq", "dk", "dv", "d_sinks")[:len(inputs)]
    result = dict(check=name, dtype=str(dtype).split(".")[-1], shape=shape, backend=backend, out=rel(out[rows], ref[rows]),
                  **{key: rel(g, w) for key, g, w in zip(names, got, want)},
                  nan=any(torch.isnan(x).any().item() for x in (out, *got)))
    limit = 2e-2 if dtype == torch.bfloat16 else 1e-4
    result["ok"] = not result["nan"] and max(result[key] for key in ("out", *names)) < limit
    return result


def gpt_oss_sinks(dtype=torch.bfloat16):
    """gpt-oss's 64 learned sink logits (one per query head), at a scale that takes a real share of each row."""
    return (torch.randn(64, device="cuda") * 2).to(dtype).requires_grad_()


def fwd_bwd_ms(fn, shape, dtype=torch.bfloat16):
    from triton.testing import do_bench
    b, hq, hk, t, d = shape
    q, k, v = make(b, hq, hk, t, d, dtype)
    grad = torch.randn(b, hq, t, d, device="cuda", dtype=dtype)

    def step():
        out = fn(q, k, v)
        torch.autograd.grad(out, (q, k, v), grad)

    started = time.perf_counter()
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - started
    return do_bench(step, warmup=50, rep=300, return_mode="median"), first


def dense_window_sdpa(window, t, segments=None):
    # (a window >= T gives the plain causal mask, which transformers still materialised)
    mask = core.dense_mask(t, core.effective_window(window, t), None, segments, "cuda")
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


def causal_sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=q.shape[1] != k.shape[1])


def attention_flops(b, hq, t, d, visible_fraction):
    return 4 * b * hq * t * t * d * visible_fraction * 3.5  # forward 2 matmuls + backward 5 = 3.5x forward


# FlexAttention kernel_options to try on a D-256 layer: torch's default first, then forward tiles (with the default
# backward), then backward tiles (with the default forward). Each fits the H200's 227 KiB of shared memory per block
# (inductor's own autotuning tried larger ones and skipped them as out of resource, which cost the call's time).
FLEX_CANDIDATES = [
    None,
    dict(BLOCK_M=128, BLOCK_N=64, fwd_num_warps=8, fwd_num_stages=2),
    dict(BLOCK_M=128, BLOCK_N=32, fwd_num_warps=8, fwd_num_stages=3),
    dict(BLOCK_M=64, BLOCK_N=64, fwd_num_warps=4, fwd_num_stages=2),
    dict(BLOCK_M1=32, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=32, bwd_num_warps=4, bwd_num_stages=2),
    dict(BLOCK_M1=64, BLOCK_N1=64, BLOCK_M2=64, BLOCK_N2=64, bwd_num_warps=8, bwd_num_stages=1),
]


GEMMA2_GLOBAL = ("gemma2 global layer, soft-cap 50", (1, 16, 8, 8192, 256), dict(softcap=50.0))
GEMMA2_SLIDING = ("gemma2 sliding layer, window 4096 + soft-cap 50", (1, 16, 8, 8192, 256),
                  dict(softcap=50.0, window=4096))


def visible_fraction(t, window=None):
    """The share of the T x T square that causality and the window leave visible."""
    w = t if window is None else min(window, t)
    return (w * (w + 1) / 2 + (t - w) * w) / (t * t)


def time_layer(case, shape, options, backend, **extra):
    """One JSON line: forward alone and forward + backward of causal_attention on this layer."""
    from triton.testing import do_bench

    b, hq, hk, t, d = shape
    attend = lambda q, k, v: core.causal_attention(q, k, v, backend=backend, **options)  # noqa: E731
    entry = dict(case=case, shape=shape, backend=backend, **extra)
    try:
        entry["fwd_bwd_ms"], entry["first_call_s"] = fwd_bwd_ms(attend, shape)
        q, k, v = make(b, hq, hk, t, d, torch.bfloat16)
        with torch.no_grad():
            entry["fwd_ms"] = do_bench(lambda: attend(q, k, v), warmup=20, rep=200, return_mode="median")
        flops = attention_flops(b, hq, t, d, visible_fraction(t, options.get("window")))
        entry["tflops"] = round(flops / entry["fwd_bwd_ms"] / 1e9)
    except Exception as error:  # an option torch or Triton rejects (out of resources): say so and go on
        entry["error"] = f"{type(error).__name__}: {error}"[:300]
    print(json.dumps(entry), flush=True)


def tune_flex():
    """Gemma 2's global layer (soft-cap 50, D 256) at 8192 x 1 under each of FLEX_CANDIDATES: forward alone and
    forward + backward, one JSON line each; the fastest forward's and backward's options together are what to
    put in core.FLEX_KERNEL_OPTIONS[256]."""
    case, shape, options = GEMMA2_GLOBAL
    d = shape[-1]
    chosen = core.FLEX_KERNEL_OPTIONS.get(d)
    for candidate in FLEX_CANDIDATES:
        torch._dynamo.reset()
        core.FLEX_KERNEL_OPTIONS[d] = candidate or {}
        time_layer(case, shape, options, "flex", kernel_options=candidate)
    core.FLEX_KERNEL_OPTIONS[d] = chosen


# Tiles of our Triton kernel (flash.TILES[256] overrides) to try on a D-256 layer: the defaults first, then one
# kernel's tiles changed at a time. All fit the H200's 227 KiB of shared memory per block; the larger float32
# accumulators (128 x 256 forward) may spill registers, which is what the timing tells.
TRITON_CANDIDATES = [
    None,
    dict(fwd=(128, 64, 8, 2)),
    dict(fwd=(64, 32, 4, 2)),
    dict(fwd=(64, 64, 4, 2)),
    dict(dkdv=(32, 32, 4, 2), dq=(32, 32, 4, 2)),
    dict(dkdv=(64, 32, 4, 1), dq=(64, 32, 4, 1)),
    dict(dkdv=(128, 32, 8, 1), dq=(64, 64, 8, 1)),
]


def tune_triton(checks=True):
    """backend="triton" against FlexAttention (with core.FLEX_KERNEL_OPTIONS) on Gemma 2's global and sliding layers
    at 8192 x 1: first the kernel's error against the float32 reference (bf16 and float32, D 256, soft-cap and
    window; checks=False skips it), then one JSON line per layer for flex and per TRITON_CANDIDATES entry for
    triton. The fastest forward's and backward kernels' tiles go in flash.TILES[256]; core.TRITON_HEAD_DIMS says
    where "auto" picks triton over flex."""
    from lanner.kernels.attention import flash  # importable once core is (_import_lanner)

    os.environ["LANNER_ATTENTION"] = "triton"  # check() dispatches (and labels) as "auto" would, triton forced
    for dtype in (torch.bfloat16, torch.float32) if checks else ():
        for name, options in (("softcap 50 + window 512", dict(softcap=50.0, window=512)),
                              ("softcap 50", dict(softcap=50.0))):
            print(json.dumps(check(f"triton {name}, d256", (1, 16, 8, 2048, 256), dtype, **options)), flush=True)
    del os.environ["LANNER_ATTENTION"]
    defaults = dict(flash.TILES[256])
    for case, shape, options in (GEMMA2_GLOBAL, GEMMA2_SLIDING):
        torch._dynamo.reset()
        time_layer(case, shape, options, "flex")
        for candidate in TRITON_CANDIDATES:
            flash.TILES[256] = {**defaults, **(candidate or {})}
            time_layer(case, shape, options, "triton", tiles=flash.TILES[256])
    flash.TILES[256] = defaults


# Plain causal GQA at head dim 128 (no window, no soft-cap): Qwen3-1.7B at 8,192 x 1 and 2,048 x 4, the Llama-3 8B
# layer, Qwen2.5-1.5B's six query heads a key/value head.
PLAIN_CAUSAL_SHAPES = [(1, 16, 8, 8192, 128), (4, 16, 8, 2048, 128), (1, 32, 8, 8192, 128), (1, 12, 2, 8192, 128)]


def sdpa_backends():
    """What "auto" runs for plain causal attention (SDPA with enable_gqa, torch's choice) against each SDPA backend
    forced, with k/v shared (GQA) or expanded, and our Triton kernel: forward + backward, one JSON line each."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def forced(backend, expand):
        def attend(q, k, v):
            if expand:
                k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], 1) for x in (k, v))
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=not expand)
        return attend

    for shape in PLAIN_CAUSAL_SHAPES:
        b, hq, _, t, d = shape
        kernels = {"auto (sdpa, enable_gqa)": lambda q, k, v: core.causal_attention(q, k, v),
                   "triton": lambda q, k, v: core.causal_attention(q, k, v, backend="triton")}
        for backend in (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
            for expand in (False, True):
                kernels[f"{backend.name.lower()}{', k/v expanded' if expand else ''}"] = forced(backend, expand)
        for name, attend in kernels.items():
            entry = dict(shape=shape, kernel=name)
            try:
                entry["fwd_bwd_ms"] = round(fwd_bwd_ms(attend, shape)[0], 3)
                flops = attention_flops(b, hq, t, d, visible_fraction(t))
                entry["tflops"] = round(flops / entry["fwd_bwd_ms"] / 1e9)
            except RuntimeError as error:  # a backend without a kernel for this call
                entry["error"] = f"{error}"[:200]
            print(json.dumps(entry), flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true", help="checks only")
    parser.add_argument("--timings-only", action="store_true")
    parser.add_argument("--cases", default=None, help="comma-separated indices of the timing cases to run")
    parser.add_argument("--tune-flex", action="store_true",
                        help="instead: FlexAttention's tiles on Gemma 2's global layer (tune_flex)")
    parser.add_argument("--tune-triton", action="store_true",
                        help="instead: our Triton kernel's error and tiles against flex on Gemma 2's layers (tune_triton)")
    parser.add_argument("--sdpa-backends", action="store_true",
                        help="instead: plain causal GQA at head dim 128, each SDPA backend and ours (sdpa_backends)")
    args = parser.parse_args()
    if args.sdpa_backends:
        sdpa_backends()
        return
    if args.tune_flex:
        tune_flex()
        return
    if args.tune_triton:
        tune_triton(checks=not args.timings_only)
        return
    import transformers
    import triton
    results = dict(versions=dict(torch=torch.__version__, triton=triton.__version__, transformers=transformers.__version__,
                                 gpu=torch.cuda.get_device_name()), checks=[], timings=[])
    mistral, gemma, gpt_oss = (2, 32, 8, 2048, 128), (1, 16, 8, 2048, 256), (2, 64, 8, 2048, 64)
    checks = [
        ("causal (sdpa)", mistral, {}),
        ("window 512", mistral, dict(window=512)),
        ("window >= seq (sdpa)", mistral, dict(window=4096)),
        ("gemma2 softcap 50 + window 512, d256", gemma, dict(softcap=50.0, window=512)),
        ("gemma2 softcap 50 global, d256", gemma, dict(softcap=50.0)),
        ("packed 4 x 512", mistral, dict(segments=segments_for(2, 2048, 512))),
        ("packed 4 x 512 + window 256", mistral, dict(segments=segments_for(2, 2048, 512), window=256)),
        ("left padding 300", mistral, dict(padding=left_padding(2, 2048, 300))),
        ("gpt-oss sinks + window 128, d64", gpt_oss, dict(window=128, sinks=gpt_oss_sinks)),
        ("gpt-oss sinks global, d64", gpt_oss, dict(sinks=gpt_oss_sinks)),
    ]
    for dtype in (() if args.timings_only else (torch.bfloat16, torch.float32)):
        for name, shape, options in checks:
            options = {key: value(dtype) if callable(value) else value for key, value in options.items()}
            try:
                r = check(name, shape, dtype, **options)
            except Exception as error:  # keep going: one failure must not hide the others
                r = dict(check=name, dtype=str(dtype), error=f"{type(error).__name__}: {error}"[:300], ok=False)
            results["checks"].append(r)
            print(json.dumps(r), flush=True)
    if not args.quick:
        # (label, shape (B, Hq, Hk, T, D), our options, baselines)
        timings = [
            ("mistral-7b T4096 B2 window 4096 (= no window)", (2, 32, 8, 4096, 128), dict(window=4096),
             {"transformers: SDPA + dense window mask": dense_window_sdpa(4096, 4096)}),
            ("mistral-7b T8192 B1 window 4096", (1, 32, 8, 8192, 128), dict(window=4096),
             {"transformers: SDPA + dense window mask": dense_window_sdpa(4096, 8192),
              "causal SDPA, no window (not the same math)": causal_sdpa}),
            ("gemma2-9b T8192 B1 sliding layer: window 4096 + softcap 50, d256", (1, 16, 8, 8192, 256),
             dict(window=4096, softcap=50.0),
             {"transformers sdpa (dense mask, drops the softcap)": dense_window_sdpa(4096, 8192)}),
            ("gemma2-9b T8192 B1 global layer: softcap 50, d256", (1, 16, 8, 8192, 256), dict(softcap=50.0),
             {"causal SDPA (drops the softcap)": causal_sdpa}),
            ("gemma2-9b T4096 B2 sliding layer (window = T: softcap only)", (2, 16, 8, 4096, 256),
             dict(window=4096, softcap=50.0), {"causal SDPA (drops the softcap)": causal_sdpa}),
            ("llama-8b packed T8192 B1, 8 samples of 1024", (1, 32, 8, 8192, 128),
             dict(segments=segments_for(1, 8192, 1024)),
             {"transformers: SDPA + dense block-diagonal mask": dense_window_sdpa(None, 8192, segments_for(1, 8192, 1024)),
              "causal SDPA over the row (not the same math)": causal_sdpa}),
            ("gpt-oss-20b T2048 B4 sliding layer: window 128 + sinks, d64", (4, 64, 8, 2048, 64),
             dict(window=128, sinks=gpt_oss_sinks()), {"causal SDPA, no window, no sinks (not the same math)": causal_sdpa}),
            ("gpt-oss-20b T2048 B4 global layer: sinks, d64", (4, 64, 8, 2048, 64), dict(sinks=gpt_oss_sinks()),
             {"causal SDPA, no sinks (not the same math)": causal_sdpa}),
        ]
        if args.cases:
            timings = [timings[int(i)] for i in args.cases.split(",")]
        for label, shape, options, baselines in timings:
            torch._dynamo.reset()  # each case compiles afresh: the first call's time is its compile time
            b, hq, hk, t, d = shape
            ours = lambda q, k, v, o=options: core.causal_attention(q, k, v, **o)  # noqa: E731
            entry = dict(case=label, shape=shape)
            try:
                q = torch.empty(1, hq, t, d, device="cuda")
                entry["our_backend"] = core.call_backend(q, core.effective_window(options.get("window"), t),
                                                         options.get("softcap"), options.get("padding"),
                                                         options.get("segments"), options.get("sinks"))
                entry["ours_ms"], entry["ours_first_call_s"] = fwd_bwd_ms(ours, shape)
            except Exception as error:
                entry["ours_error"] = f"{type(error).__name__}: {error}"[:300]
            for name, fn in baselines.items():
                try:
                    entry[name] = fwd_bwd_ms(fn, shape)[0]
                except Exception as error:
                    entry[name] = f"{type(error).__name__}: {error}"[:200]
            results["timings"].append(entry)
            print(json.dumps(entry), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print("checks ok:", all(r.get("ok") for r in results["checks"]), flush=True)


if __name__ == "__main__":
    main()
