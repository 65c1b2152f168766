"""Mixture-of-experts LoRA on the GPU: one MoE layer's experts, then whole training steps, against the peers.

    python benchmarks/moe_bench.py layer [--shape qwen3-30b-a3b] [--tokens 8192]
    python benchmarks/moe_bench.py step MODE [--shape qwen3-30b-a3b] [--layers 48] [--seq 2048 --bs 4]
    python benchmarks/moe_bench.py all [--shape ...] [--layers N] [--modes lanner unsloth]   # one process each

layer: the routed experts of one layer (random routing from a random router, bf16, LoRA r16 on gate_up
and down), forward + backward, triton.testing.do_bench medians: lanner.kernels' grouped path
(`lora_moe_experts`) against PEFT's ParamWrapper on transformers' experts (grouped_mm: W + B A is
built for every expert each call) and against transformers' per-expert loop (eager); and the bf16
output and gradients of ours against a float32 eager reference (relative Frobenius error), next to
PEFT's grouped_mm bf16 error.

step MODE: hf (PEFT target_parameters on transformers' grouped_mm experts), hf_eager (its per-expert
loop), lanner (get_lora_model), unsloth (FastLanguageModel, when unsloth is importable; it loads from
a saved random model, so every mode takes --layers alike when the full model does not fit the disk).
--load-in-4bit: QLoRA for lanner (NF4 linears and experts) and unsloth (its own 4-bit load).
LoRA r16 on q,k,v,o and the experts' gate/up/down; gradient checkpointing; fused AdamW; median of
--steps steps after --warmup. One JSON line per mode: tokens/s, step ms, peak GiB, final loss and the
count of LoRA parameters (so that a peer that silently skipped the experts shows it); lanner's also its memory
plan. lanner takes the memory engine's --budget and --offload; `all --matched-budget` runs it again under
MATCHED_BUDGET x Unsloth's measured peak (list unsloth first in --modes), the bar's memory bound.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from peer_bench import MATCHED_BUDGET

SHAPES = {
    # Qwen3-30B-A3B: 128 experts, top-8, expert MLP 768, 48 layers.
    "qwen3-30b-a3b": ("qwen3_moe", dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
                                        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                                        head_dim=128, num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
                                        vocab_size=151936, max_position_embeddings=8192, rope_theta=1e6)),
    # gpt-oss-20b: 32 experts, top-4, expert MLP 2880, biases, interleaved gate/up, clamped SwiGLU; attention
    # with sinks, sliding (128) and full layers alternating (on transformers' attention: sinks).
    "gpt-oss-20b": ("gpt_oss", dict(hidden_size=2880, intermediate_size=2880, num_hidden_layers=24,
                                    num_attention_heads=64, num_key_value_heads=8, head_dim=64, num_local_experts=32,
                                    num_experts_per_tok=4, sliding_window=128, vocab_size=201088)),
    # A smoke-test shape (runs on the CPU with --device cpu; no timing there).
    "tiny": ("qwen3_moe", dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                               num_experts_per_tok=2, norm_topk_prob=True, vocab_size=128)),
    # Mixtral-style: 8 experts, top-2, expert MLP 14336.
    "mixtral-8x7b": ("mixtral", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                     num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                                     num_experts_per_tok=2, vocab_size=32000, max_position_embeddings=8192,
                                     rope_theta=1e6)),
}
STEP_MODES = ("hf", "hf_eager", "lanner", "unsloth")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EXPERT_PARAMETERS = ["experts.gate_up_proj", "experts.down_proj"]


def peft_targets(args) -> list[str]:
    """target_modules for PEFT (hf, lanner). With gate_proj and up_proj both targeted, PEFT adapts transformers 5's
    fused experts.gate_up_proj at rank 2r (rank r for each projection it replaces) where Unsloth adapts it at rank r:
    --gate-up fused (the default) leaves them out, so every system trains the same rank-r gate_up adapter."""
    return TARGETS if args.gate_up == "split" else [t for t in TARGETS if t not in ("gate_proj", "up_proj")]
REPO = Path(__file__).resolve().parents[1]


def import_lanner():
    try:
        import lanner.kernels  # noqa: F401
    except ImportError:  # a checkout where lanner is not installed (the GPU machine): as run.py does
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from run import lanner_import_root
        sys.path.insert(0, str(lanner_import_root()))


def config_of(shape: str, layers: int | None):
    import transformers
    family, values = SHAPES[shape]
    values = {**values, **({"num_hidden_layers": layers} if layers else {})}
    config_cls = {"qwen3_moe": transformers.Qwen3MoeConfig, "mixtral": transformers.MixtralConfig,
                  "gpt_oss": transformers.GptOssConfig}[family]
    return config_cls(**values, dtype="bfloat16")


def model_class(shape: str):
    import transformers
    return {"qwen3_moe": transformers.Qwen3MoeForCausalLM, "mixtral": transformers.MixtralForCausalLM,
            "gpt_oss": transformers.GptOssForCausalLM}[SHAPES[shape][0]]


# --- one layer's experts ---------------------------------------------------------------------------

def hf_attention(shape: str) -> str:
    """transformers' attention for the hf modes (lanner replaces it): SDPA, or eager where the family has no SDPA
    path (gpt-oss: its sinks)."""
    return "eager" if SHAPES[shape][0] == "gpt_oss" else "sdpa"


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def layer_bench(args) -> dict:
    import torch
    import triton.testing
    from peft import LoraConfig, get_peft_model

    import_lanner()
    from lanner.kernels.patching.moe import _unwrap, lora_experts

    config = config_of(args.shape, 1)
    modeling = sys.modules[model_class(args.shape).__module__]
    experts_cls = next(getattr(modeling, n) for n in dir(modeling) if n.endswith("Experts"))
    router_cls = next(getattr(modeling, n) for n in dir(modeling) if n.endswith("TopKRouter"))
    torch.manual_seed(0)
    results = {"shape": args.shape, "tokens": args.tokens, "mode": "layer"}
    with torch.device(args.device):
        router = router_cls(config).to(torch.bfloat16)
        torch.nn.init.normal_(router.weight, std=0.02)

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.experts = experts_cls(config)

        block = Block().to(torch.bfloat16)
        for p in block.experts.parameters():
            torch.nn.init.normal_(p, std=0.02)
        block = get_peft_model(block, LoraConfig(r=args.rank, lora_alpha=args.rank,
                                                 target_parameters=EXPERT_PARAMETERS))
        with torch.no_grad():
            for name, p in block.named_parameters():
                if "lora_B" in name:
                    p.normal_(std=0.02)
        x = torch.randn(args.tokens, config.hidden_size, dtype=torch.bfloat16)
        dout = torch.randn_like(x)
    top_k_weights = None
    with torch.no_grad():
        _, top_k_weights, top_k_index = router(x)

    def inputs(dtype):
        return x.detach().to(dtype).requires_grad_(), top_k_weights.detach().to(dtype).requires_grad_()

    def ours(module, h, w):
        return lora_experts(module, h, top_k_index, w)

    def peft(implementation):
        def run(module, h, w):
            _unwrap(module)[0].config._experts_implementation = implementation
            return module(h, top_k_index, w)
        return run

    def outputs_and_grads(fn, model, dtype):
        h, w = inputs(dtype)
        lora = [p for p in model.parameters() if p.requires_grad]
        for p in lora:
            p.grad = None
        out = fn(model.base_model.model.experts, h, w)
        out.backward(dout.to(dtype))
        return [out, h.grad, w.grad] + [p.grad.clone() for p in lora]

    # output, dx, d(routing weights), then the LoRA gradients; relative to transformers' per-expert loop in
    # float32 (the same weights, upcast)
    reference = outputs_and_grads(peft("eager"), copy.deepcopy(block).float(), torch.float32)
    for name, fn in (("lanner", ours), ("peft_grouped_mm", peft("grouped_mm"))):
        results[f"{name}_rel_err_bf16"] = [round(rel(a, b), 5)
                                          for a, b in zip(outputs_and_grads(fn, block, torch.bfloat16), reference)]
    if args.device != "cuda":
        return results
    h, w = inputs(torch.bfloat16)
    experts_module = block.base_model.model.experts

    def step(fn):
        return lambda: fn(experts_module, h, w).backward(dout)

    for name, fn in (("lanner", ours), ("peft_grouped_mm", peft("grouped_mm")), ("peft_eager", peft("eager"))):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        ms = triton.testing.do_bench(step(fn), warmup=5, rep=50 if name != "peft_eager" else 10)
        results[f"{name}_ms"] = round(ms, 3)
        results[f"{name}_peak_extra_gib"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 2)
    return results


# --- training steps ------------------------------------------------------------------------------

def saved_dir(args) -> str:
    """Random weights saved once (unsloth loads from a path); same seed and config as the in-memory modes."""
    import torch
    path = f"/tmp/rand-{args.shape}-{args.layers or 'all'}"
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = model_class(args.shape)(config_of(args.shape, args.layers)).to(torch.bfloat16)
        model.save_pretrained(path)
        del model
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
        PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>")),
                                bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                unk_token="<unk>").save_pretrained(path)
        torch.cuda.empty_cache()
    return path


def build(args):
    import torch
    from peft import LoraConfig, get_peft_model

    if args.mode == "unsloth":
        import unsloth  # noqa: F401  (must precede transformers)
        from unsloth import FastLanguageModel
        started = time.perf_counter()
        path = saved_dir(args)
        print(f"random weights saved in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        model, _ = FastLanguageModel.from_pretrained(path, max_seq_length=args.seq, dtype=torch.bfloat16,
                                                     load_in_4bit=args.load_in_4bit, local_files_only=True)
        print(f"loaded by unsloth at {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        return FastLanguageModel.get_peft_model(model, r=args.rank, lora_alpha=args.rank, lora_dropout=0,
                                                bias="none", target_modules=TARGETS,
                                                use_gradient_checkpointing="unsloth")
    if args.load_in_4bit and args.mode != "lanner":
        raise SystemExit(f"--load-in-4bit: {args.mode} builds its model in memory, which bitsandbytes cannot quantise "
                         "(and it would leave the experts in 16 bits)")
    torch.manual_seed(0)
    implementation = "eager" if args.mode == "hf_eager" else "grouped_mm"
    with torch.device("cuda"):
        model = model_class(args.shape)._from_config(config_of(args.shape, args.layers), dtype=torch.bfloat16,
                                                     attn_implementation=hf_attention(args.shape),
                                                     experts_implementation=implementation)
    if args.mode == "lanner":
        import_lanner()
        from lanner.kernels import get_lora_model
        return get_lora_model(model, r=args.rank, lora_alpha=args.rank, target_modules=peft_targets(args),
                              target_parameters=EXPERT_PARAMETERS, load_in_4bit=args.load_in_4bit,
                              memory_budget_gib=args.budget,
                              offload_checkpoints={"on": True, "off": False}.get(args.offload))
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    return get_peft_model(model, LoraConfig(r=args.rank, lora_alpha=args.rank, lora_dropout=0.0, bias="none",
                                            target_modules=peft_targets(args), target_parameters=EXPERT_PARAMETERS,
                                            task_type="CAUSAL_LM"))


def step_bench(args) -> dict:
    import torch
    model = build(args)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
    vocab = model.config.vocab_size
    generator = torch.Generator(device="cuda").manual_seed(1)
    batches = [torch.randint(0, vocab, (args.bs, args.seq), device="cuda", generator=generator) for _ in range(4)]
    torch.cuda.reset_peak_memory_stats()
    times, loss, profiler = [], None, None
    timed = args.warmup + args.steps
    for i in range(timed + (2 if args.kernel_profile_dir else 0)):
        ids = batches[i % len(batches)]
        if i == timed:  # two more steps, untimed, by kernel
            # with the host's ops and Python frames: the step is host-bound (trace_gaps.py --host)
            profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                          torch.profiler.ProfilerActivity.CUDA], with_stack=True)
            profiler.__enter__()
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if args.warmup <= i < timed:
            times.append(time.perf_counter() - start)
        loss = out.loss.item()
    if profiler is not None:
        from peer_bench import write_kernel_profile
        profiler.__exit__(None, None, None)
        write_kernel_profile(profiler, Path(args.kernel_profile_dir) / f"kernels-moe-{args.mode}-{args.shape}.txt", steps=2)
    ms = statistics.median(times) * 1000
    extra = {}
    if args.mode == "lanner":
        from lanner.kernels.memory import memory_engine_of
        plan = memory_engine_of(model).plan
        extra = dict(budget=args.budget, offload=args.offload, plan=" ".join(p.code for p in plan.layers),
                     predicted_peak_gib=round(plan.predicted_peak_bytes / 2**30, 2))
    return dict(**extra, mode=args.mode, load_in_4bit=args.load_in_4bit, shape=args.shape, layers=args.layers or model.config.num_hidden_layers,
                seq=args.seq, bs=args.bs, rank=args.rank, step_ms=round(ms, 1),
                tok_s=round(args.bs * args.seq / ms * 1000),
                peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2), loss=round(loss, 4),
                lora_params=sum(p.numel() for p in params), gpu=torch.cuda.get_device_name())


def last_lines(output: str | bytes | None) -> str:
    """A step process's last three lines of output, on one line (a timed-out run's come as bytes)."""
    text = output.decode(errors="replace") if isinstance(output, bytes) else output or ""
    return " | ".join(text.strip().splitlines()[-3:])


def run_all(args) -> None:
    lines = []
    unsloth_missing = subprocess.run([sys.executable, "-c", "import unsloth"], capture_output=True).returncode

    def run(mode, *extra):
        command = [sys.executable, __file__, "step", mode, "--shape", args.shape, "--seq", str(args.seq),
                   "--bs", str(args.bs), "--steps", str(args.steps), "--warmup", str(args.warmup),
                   "--rank", str(args.rank), "--gate-up", args.gate_up] + (["--layers", str(args.layers)] if args.layers else []) \
            + (["--kernel-profile-dir", args.kernel_profile_dir] if args.kernel_profile_dir else []) \
            + (["--load-in-4bit"] if args.load_in_4bit else []) + list(extra)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
        except subprocess.TimeoutExpired as late:  # say so and go on to the next mode
            lines.append(dict(mode=mode, error=f"timed out after {args.timeout} s | {last_lines(late.stderr)}"))
        else:
            json_lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            lines.append(json.loads(json_lines[-1]) if json_lines else
                         dict(mode=mode, error=last_lines(done.stderr or done.stdout)))
        print(json.dumps(lines[-1]), flush=True)

    for mode in args.modes:
        if mode == "unsloth" and unsloth_missing:
            lines.append(dict(mode=mode, error="unsloth is not importable"))
            continue
        run(mode, *(["--budget", str(args.budget), "--offload", args.offload] if mode == "lanner" and args.budget else []))
        unsloth = next((r for r in lines if r.get("mode") == "unsloth" and "peak_gib" in r), None)
        if mode == "lanner" and args.matched_budget and unsloth:
            run(mode, "--budget", f"{MATCHED_BUDGET * unsloth['peak_gib']:.2f}", "--offload", "on")
    lanner = ([r for r in lines if r.get("mode") == "lanner" and "error" not in r] or [None])[-1]  # the budget row if run
    for r in lines:
        if lanner and "error" not in r:
            r["lanner_speedup"] = round(lanner["tok_s"] / r["tok_s"], 2)
            r["lanner_memory_ratio"] = round(lanner["peak_gib"] / r["peak_gib"], 2)
    if args.out:
        Path(args.out).write_text("\n".join(json.dumps(r) for r in lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=("layer", "step", "all"))
    parser.add_argument("mode", nargs="?", choices=STEP_MODES)
    parser.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    parser.add_argument("--tokens", type=int, default=8192, help="layer: tokens routed")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--bs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--gate-up", choices=("fused", "split"), default="fused",
                        help="step: gate_up adapted at rank r (fused, as Unsloth) or 2r (split: PEFT's rank r per projection)")
    parser.add_argument("--budget", type=float, default=None, help="lanner: the memory engine's budget in GiB")
    parser.add_argument("--offload", choices=("auto", "on", "off"), default="auto",
                        help="lanner: offload checkpointed layers' inputs (auto: when the budget needs it)")
    parser.add_argument("--matched-budget", action="store_true",
                        help=f"all: lanner again under a budget of {MATCHED_BUDGET}x Unsloth's peak (with offloading; "
                             "list unsloth before lanner in --modes)")
    parser.add_argument("--load-in-4bit", action="store_true",
                        help="step, all: QLoRA (lanner: NF4 linears and experts; unsloth: its 4-bit load); hf refuses")
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--out", default=None, help="all: write every mode's JSON line here; step: append its line")
    parser.add_argument("--modes", nargs="+", choices=STEP_MODES, default=list(STEP_MODES), help="all: the step modes to run")
    parser.add_argument("--kernel-profile-dir", default=None,
                        help="step, all: GPU time by kernel over the last two steps, a file per mode in this folder")
    parser.add_argument("--device", default="cuda", help="layer: cpu checks the errors only (TRITON_INTERPRET=1)")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.what == "layer":
        print(json.dumps(layer_bench(args)), flush=True)
    elif args.what == "step":
        if args.mode is None:
            parser.error("step needs a MODE")
        line = json.dumps(step_bench(args))
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as out:
                out.write(line + "\n")
    else:
        run_all(args)


if __name__ == "__main__":
    main()
