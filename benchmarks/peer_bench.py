"""One training step of LoRA/QLoRA, timed, for one system per process (run.py runs them all).

Copied from ../shared/tools/peer_bench.py (the peers' harness) with one addition, the `lanner`
mode, so that every system is measured by the same loop, data, optimizer and JSON line.

One mode per process:  python peer_bench.py MODE MODEL [--seq S --bs B --steps N]
MODE: hf | liger | unsloth | hf4 | unsloth4 | hfnogc | lanner | lanner4 (built in qlora_modes.py)
lanner takes --budget GIB (the memory engine's budget) and --offload on|off|auto.
MODEL: a name in CONFIGS (random-init weights of that architecture); add shapes freely.
Prints one JSON line: mode, model, tokens/s, step ms (median), peak GiB, loss.
"""
import argparse, json, os, statistics, sys, time

CONFIGS = {
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                     tie_word_embeddings=True, rope_theta=500000.0, max_position_embeddings=8192),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                     tie_word_embeddings=False, rope_theta=500000.0, max_position_embeddings=8192),
}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def llama_config(name):
    import transformers
    c = dict(CONFIGS[name]); arch = c.pop("arch", "llama")
    cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
           "mistral": transformers.MistralConfig}[arch]
    return cls(**c, rms_norm_eps=1e-5 if arch != "qwen2" else 1e-6, torch_dtype="bfloat16")


def model_class(name):
    import transformers
    arch = CONFIGS[name].get("arch", "llama")
    return {"llama": transformers.LlamaForCausalLM, "qwen2": transformers.Qwen2ForCausalLM,
            "mistral": transformers.MistralForCausalLM}[arch]


def saved_dir(name):
    """Random weights saved once, for loaders that need a path (unsloth, 4-bit)."""
    import torch
    LlamaForCausalLM = model_class(name)
    d = f"/tmp/rand-{name}"
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        torch.manual_seed(0)
        with torch.device("cuda"):
            m = LlamaForCausalLM(llama_config(name)).to(torch.bfloat16)
        m.save_pretrained(d)
        del m
        from tokenizers import Tokenizer, models
        from transformers import PreTrainedTokenizerFast
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
        tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
        PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                pad_token="<pad>", unk_token="<unk>").save_pretrained(d)
        torch.cuda.empty_cache()
    return d


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode"); ap.add_argument("model")
    ap.add_argument("--seq", type=int, default=2048); ap.add_argument("--bs", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10); ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--budget", type=float, default=None, help="lanner: memory budget in GiB")
    ap.add_argument("--offload", choices=["on", "off", "auto"], default="auto", help="lanner: checkpoint offloading")
    a = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    if a.mode.startswith("unsloth"):
        import unsloth  # noqa: F401  (must precede transformers)
        from unsloth import FastLanguageModel
    from transformers import BitsAndBytesConfig
    LlamaForCausalLM = model_class(a.model)
    from peft import LoraConfig, get_peft_model

    if a.mode == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_llama
        apply_liger_kernel_to_llama(rope=True, rms_norm=True, swiglu=True,
                                    cross_entropy=False, fused_linear_cross_entropy=True)
    torch.manual_seed(0)
    gc = a.mode != "hfnogc"
    if a.mode.startswith("unsloth"):
        model, _ = FastLanguageModel.from_pretrained(
            saved_dir(a.model), max_seq_length=a.seq, dtype=torch.bfloat16,
            load_in_4bit=a.mode == "unsloth4", local_files_only=True)
        model = FastLanguageModel.get_peft_model(
            model, r=a.rank, lora_alpha=a.rank, lora_dropout=0, bias="none",
            target_modules=TARGETS, use_gradient_checkpointing="unsloth")
    elif a.mode == "lanner":
        from lanner.kernels import get_lora_model
        with torch.device("cuda"):
            model = LlamaForCausalLM._from_config(llama_config(a.model), dtype=torch.bfloat16,
                                                  attn_implementation="sdpa")
        offload = {"on": True, "off": False, "auto": None}[a.offload]
        model = get_lora_model(model, r=a.rank, lora_alpha=a.rank, target_modules=TARGETS,
                               lora_dropout=0.0, gradient_checkpointing=gc, bias="none",
                               memory_budget_gib=a.budget, offload_checkpoints=offload)
    elif a.mode == "lanner4":
        from qlora_modes import lanner4_model
        model = lanner4_model(saved_dir(a.model), a.rank, TARGETS, gc, a.budget,
                              {"on": True, "off": False, "auto": None}[a.offload])
    else:
        if a.mode == "hf4":
            q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                   bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=torch.bfloat16)
            model = LlamaForCausalLM.from_pretrained(saved_dir(a.model), quantization_config=q,
                                                     dtype=torch.bfloat16, device_map={"": 0},
                                                     attn_implementation="sdpa")
        else:
            with torch.device("cuda"):
                model = LlamaForCausalLM._from_config(llama_config(a.model), dtype=torch.bfloat16,
                                                      attn_implementation="sdpa")
        if gc:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=a.rank, lora_dropout=0.0,
                                                 bias="none", target_modules=TARGETS,
                                                 task_type="CAUSAL_LM"))
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    vocab = CONFIGS[a.model]["vocab_size"]
    g = torch.Generator(device="cuda").manual_seed(1)
    batches = [torch.randint(0, vocab, (a.bs, a.seq), device="cuda", generator=g) for _ in range(4)]
    torch.cuda.reset_peak_memory_stats()
    times, loss = [], None
    for i in range(a.warmup + a.steps):
        ids = batches[i % len(batches)]
        torch.cuda.synchronize(); t = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
        loss = out.loss.item()
    ms = statistics.median(times) * 1000
    extra = {}
    if a.mode == "lanner":
        from lanner.kernels.memory import memory_engine_of
        engine = memory_engine_of(model)
        if engine is not None and engine.plan is not None:
            plan = engine.plan
            extra = dict(budget=a.budget, offload=a.offload,
                         predicted_peak_gib=round(plan.predicted_peak_bytes / 2**30, 2),
                         plan=" ".join(p.code for p in plan.layers))
    print(json.dumps(dict(**extra, mode=a.mode, model=a.model, seq=a.seq, bs=a.bs, rank=a.rank,
                          step_ms=round(ms, 1), tok_s=round(a.bs * a.seq / ms * 1000),
                          peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2),
                          loss=round(loss, 4), gpu=torch.cuda.get_device_name())), flush=True)


if __name__ == "__main__":
    sys.exit(main())
