"""One LoRA job on 1, 2 (, 4 …) GPUs: tokens/s, the scaling efficiency, Lanner against HF + PEFT + Accelerate.

    python benchmarks/multi_gpu.py                          # llama-8b, 1 and 2 GPUs, lanner and hf
    python benchmarks/multi_gpu.py --gpus 1 2 4 --out multi_gpu.jsonl

The settings are benchmarks/peer_bench.py's (random-init weights of the shape, LoRA r16 on every
projection, bf16, non-reentrant gradient checkpointing, fused AdamW, random tokens, seq 2048,
micro-batch 4 per GPU) so that the 1-GPU figures match run.py's. Each (system, GPU count) runs in a
fresh `torchrun --standalone --nproc_per_node N` (DDP, as a Lanner job on N GPUs runs): every GPU
trains on its own micro-batch, so the global batch grows with N and tokens/s counts every GPU's tokens.

- lanner: lanner.kernels (get_lora_model: our LoRA, RMSNorm, RoPE, SwiGLU, fused linear + CE) under
  torch's DistributedDataParallel, as the Trainer wraps it in a Lanner job.
- hf: HF transformers + PEFT, wrapped by Accelerate's Accelerator (DDP).

Prints one JSON line per run, then one per system with the scaling efficiency of each GPU count
(tokens/s on N GPUs / (N × tokens/s on 1)), then Lanner's tokens/s over HF's at each count.
The peers' packages come from .peers/site (as run.py's); lanner.kernels from this checkout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from peer_bench import CONFIGS, TARGETS, llama_config, model_class  # noqa: E402
from run import environment  # noqa: E402

SYSTEMS = {"lanner": "Lanner (lanner.kernels + DDP)", "hf": "HF + PEFT + Accelerate (DDP)"}


def build(mode: str, args, device):
    import torch

    torch.manual_seed(0)
    with device:
        model = model_class(args.model)._from_config(llama_config(args.model), dtype=torch.bfloat16,
                                                     attn_implementation="sdpa")
    if mode == "lanner":
        from lanner.kernels import get_lora_model

        return get_lora_model(model, r=args.rank, lora_alpha=args.rank, target_modules=TARGETS, lora_dropout=0.0,
                              gradient_checkpointing=True, bias="none")
    from peft import LoraConfig, get_peft_model

    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    return get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=args.rank, lora_dropout=0.0, bias="none",
                                            target_modules=TARGETS, task_type="CAUSAL_LM"))


def rank_main(args) -> int:
    """One rank of one run (under torchrun): time args.steps steps after args.warmup."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    import torch.distributed as dist

    local_rank, world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    model = build(args.mode, args, device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    if args.mode == "hf":
        from accelerate import Accelerator
        from accelerate.utils import DistributedDataParallelKwargs

        accelerator = Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=False)])
        model, optimizer = accelerator.prepare(model, optimizer)
        backward = accelerator.backward
    else:
        if world > 1:
            dist.init_process_group("nccl", device_id=device)
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank],
                                                              find_unused_parameters=False,
                                                              gradient_as_bucket_view=True)
        backward = torch.Tensor.backward
    vocab = CONFIGS[args.model]["vocab_size"]
    generator = torch.Generator(device=device).manual_seed(1 + int(os.environ.get("RANK", 0)))
    batches = [torch.randint(0, vocab, (args.bs, args.seq), device=device, generator=generator) for _ in range(4)]
    torch.cuda.reset_peak_memory_stats()
    times, loss = [], None
    for step in range(args.warmup + args.steps):
        ids = batches[step % len(batches)]
        torch.cuda.synchronize()
        started = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        backward(out.loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
        loss = out.loss.item()
    # The slowest rank sets the pace: take every rank's median step time and keep the largest.
    median = torch.tensor([statistics.median(times)], device=device)
    if dist.is_initialized():
        dist.all_reduce(median, op=dist.ReduceOp.MAX)
    step_ms = median.item() * 1000
    if int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps(dict(mode=args.mode, model=args.model, gpus=world, seq=args.seq, bs_per_gpu=args.bs,
                              rank=args.rank, step_ms=round(step_ms, 1),
                              tok_s=round(world * args.bs * args.seq / step_ms * 1000),
                              peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2), loss=round(loss, 4),
                              gpu=torch.cuda.get_device_name())), flush=True)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def run_one(mode: str, gpus: int, args, env: dict) -> dict:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus),
               str(Path(__file__).resolve()), "rank", mode, "--model", args.model, "--seq", str(args.seq),
               "--bs", str(args.bs), "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--rank", str(args.rank)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return dict(mode=mode, model=args.model, gpus=gpus, error=f"timed out after {args.timeout} s")
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (done.stderr or done.stdout).strip().splitlines()[-4:]
    return dict(mode=mode, model=args.model, gpus=gpus, error=f"exit {done.returncode}: {' | '.join(tail)}")


def summaries(results: list[dict]) -> list[dict]:
    ok = {(r["mode"], r["gpus"]): r for r in results if "error" not in r}
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in results):
        one = ok.get((mode, 1))
        lines.append(dict(summary="scaling", mode=mode, system=SYSTEMS[mode], tok_s={
            n: ok[(mode, n)]["tok_s"] for m, n in ok if m == mode}, efficiency={
            n: round(ok[(mode, n)]["tok_s"] / (n * one["tok_s"]), 3) for m, n in ok if m == mode and one}))
    lines.append(dict(summary="lanner_over_hf", ratio={
        n: round(ok[("lanner", n)]["tok_s"] / ok[("hf", n)]["tok_s"], 3)
        for m, n in ok if m == "lanner" and ("hf", n) in ok}))
    return lines


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        parser = argparse.ArgumentParser()
        parser.add_argument("command")
        parser.add_argument("mode", choices=list(SYSTEMS))
    else:
        parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        parser.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
        parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
        parser.add_argument("--timeout", type=int, default=600, help="seconds per (system, GPU count) run")
        parser.add_argument("--out", type=Path, default=None, help="also append every JSON line here")
    parser.add_argument("--model", default="llama-8b", choices=list(CONFIGS))
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--bs", type=int, default=4, help="micro-batch per GPU")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    args = parser.parse_args()
    if getattr(args, "command", None) == "rank":
        return rank_main(args)

    env = environment()
    results, lines = [], []
    for gpus in args.gpus:
        for mode in args.systems:
            result = run_one(mode, gpus, args, env)
            results.append(result)
            lines.append(result)
            print(json.dumps(result), flush=True)
    for line in summaries(results):
        lines.append(line)
        print(json.dumps(line), flush=True)
    if args.out:
        with args.out.open("a") as out:
            out.writelines(json.dumps(line) + "\n" for line in lines)
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
