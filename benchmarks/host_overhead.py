"""The host's work per decoder layer of a LoRA training step, measured on the CPU without running any kernel.

    python benchmarks/host_overhead.py [--family qwen2] [--layers 8] [--no-checkpointing] [--top 25]

A small step is host-bound on the GPU (docs/benchmarks.md, twenty-fourth round: Qwen2.5-1.5B at 8,192 tokens,
GPU busy 170 ms of a 300 ms step), so the ops and Python the host runs per layer are what such a step costs.
This counts them where no GPU is: a tiny model of the family (hidden 64) on the kernels, Triton's interpreter
with every kernel launch replaced by a no-op (outputs are garbage; the host's path is the same), torch ops on
tensors of a few hundred elements (their dispatch, not their arithmetic), bf16 as the GPU benchmarks. Prints
the wall time and the aten ops per layer for one step (forward, the checkpoint's recompute, backward, fused
AdamW), and the most frequent ops. The CPU's op mix differs from CUDA's in places (its BLAS adds resolve_conj,
its fused AdamW reads the step count back): compare a change before and after here, not with a GPU trace. A
change meant to cut host time should cut these numbers; its effect in milliseconds is the GPU's to show.
"""
from __future__ import annotations

import argparse
import os
import time
from collections import Counter

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import torch  # noqa: E402
import transformers  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

from moe_bench import import_lanner  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=256, max_position_embeddings=256)


def build(family: str, layers: int, checkpointing: bool):
    import_lanner()
    from lanner.kernels import get_lora_model

    torch.manual_seed(0)
    config = transformers.AutoConfig.for_model(family, **TINY, num_hidden_layers=layers)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)  # as the GPU benchmarks
    return get_lora_model(model, r=8, lora_alpha=8, gradient_checkpointing=checkpointing)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="qwen2", help="a transformers model_type the kernels patch")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--no-checkpointing", action="store_true")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()

    interpreter.InterpretedFunction.run = lambda self, *a, **k: None
    torch.set_num_threads(1)
    model = build(args.family, args.layers, not args.no_checkpointing)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)
    ids = torch.randint(3, model.config.vocab_size, (1, 16))

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    started = time.perf_counter()
    for _ in range(args.steps):
        step()
    per_layer_ms = (time.perf_counter() - started) / args.steps / args.layers * 1000
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        step()
    ops = Counter(event.name for event in profile.events() if event.name.startswith("aten::"))
    print(f"{args.family}, {args.layers} layers, checkpointing {'off' if args.no_checkpointing else 'on'}: "
          f"{per_layer_ms:.2f} ms and {sum(ops.values()) / args.layers:.0f} aten ops per layer a step "
          "(the embedding, head, loss and optimizer included)")
    for name, count in ops.most_common(args.top):
        print(f"  {count / args.layers:7.1f}  {name}")


if __name__ == "__main__":
    main()
