"""QLoRA (NF4) rows of the side-by-side benchmark, and the NF4 dequantisation kernel on its own.

    python benchmarks/run.py --models llama-8b --systems hf4 unsloth4 lanner4   # the 4-bit rows
    python benchmarks/qlora_modes.py                                             # dequantisation, 8B shapes

The 4-bit rows are peer_bench.py modes: hf4 (HF + PEFT + bitsandbytes, NF4 with double
quantisation, bf16 compute), unsloth4 (Unsloth's load_in_4bit) and lanner4, built here: the same
saved random weights, quantised on load by lanner.kernels (NF4, block 64, double-quantised absmax,
lm_head and embeddings dense, as the peers), LoRA on the seven projections on our kernels.

The second command times `ops.nf4.dequantize_nf4` against bitsandbytes' dequantize_4bit (CUDA) on
the Llama-3 8B projection shapes with triton.testing.do_bench, and prints the bandwidth achieved
(bytes read + written over time) next to the H200's measured ~4.3 TB/s.
"""
from __future__ import annotations

import json
import sys

QLORA_SYSTEMS = {"hf4": "HF + PEFT + bitsandbytes", "unsloth4": "Unsloth 4-bit", "lanner4": "Lanner 4-bit"}
# out_features x in_features of the Llama-3 8B projections.
LLAMA_8B_WEIGHTS = {"q/o": (4096, 4096), "k/v": (1024, 4096), "gate/up": (14336, 4096), "down": (4096, 14336)}


def lanner4_model(path: str, rank: int, target_modules, gradient_checkpointing: bool,
                  memory_budget_gib: float | None = None, offload_checkpoints: bool | None = None):
    """The lanner4 mode: `path` (a saved 16-bit model) quantised on load onto the GPU, LoRA on our
    kernels; peer_bench's --budget / --offload go to the memory engine as for the lanner mode."""
    import torch

    from lanner.kernels import get_lora_model

    return get_lora_model(path, r=rank, lora_alpha=rank, target_modules=target_modules, lora_dropout=0.0,
                          gradient_checkpointing=gradient_checkpointing, bias="none", load_in_4bit=True,
                          memory_budget_gib=memory_budget_gib, offload_checkpoints=offload_checkpoints,
                          model_kwargs=dict(dtype=torch.bfloat16, attn_implementation="sdpa"))


def dequantize_bench() -> list[dict]:
    import bitsandbytes.functional as bnbf
    import torch
    from triton.testing import do_bench

    from lanner.kernels.quant import dequantize, quantize_nf4

    rows = []
    for name, shape in LLAMA_8B_WEIGHTS.items():
        weight = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        ours = quantize_nf4(weight)
        packed, state = bnbf.quantize_4bit(weight, blocksize=64, compress_statistics=True, quant_type="nf4")
        out = torch.empty(shape, device="cuda", dtype=torch.bfloat16)
        ms_ours = do_bench(lambda: dequantize(ours, out=out))
        ms_bnb = do_bench(lambda: bnbf.dequantize_4bit(packed, state, out=out))
        moved = ours.nbytes() + out.numel() * out.element_size()
        rows.append(dict(weight=name, shape=list(shape), lanner_ms=round(ms_ours, 4), bnb_ms=round(ms_bnb, 4),
                         lanner_tb_s=round(moved / ms_ours / 1e9, 2), bnb_tb_s=round(moved / ms_bnb / 1e9, 2)))
    return rows


if __name__ == "__main__":
    from run import REPO, lanner_import_root  # lanner.kernels and the peers, as run.py gives them to peer_bench

    sys.path[:0] = [str(lanner_import_root()), str(REPO / ".peers" / "site")]
    for row in dequantize_bench():
        print(json.dumps(row), flush=True)
    sys.exit(0)
