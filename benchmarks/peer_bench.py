"""One training step of LoRA/QLoRA, timed, for one system per process (run.py runs them all).

Copied from ../shared/tools/peer_bench.py (the peers' harness) with one addition, the `lanner`
mode, so that every system is measured by the same loop, data, optimizer and JSON line.

One mode per process:  python peer_bench.py MODE MODEL [--seq S --bs B --steps N]
MODE: hf | liger | unsloth | hf4 | unsloth4 | hfnogc | lanner | lanner4 (built in qlora_modes.py)
      | lanner8 (lanner over an FP8 base: get_lora_model(load_in_fp8=True), docs/fp8.md)
lanner, lanner4 and lanner8 take --budget GIB (the memory engine's budget) and --offload on|off|auto.
MODEL: a name in CONFIGS (random-init weights of that architecture); add shapes freely.
Prints one JSON line: mode, model, tokens/s, step ms (median), peak GiB, loss.
BENCH_TINY=1 shrinks MODEL to a tiny twin (tiny_config) that also runs on the CPU (lanner with
TRITON_INTERPRET=1): a check that a mode builds and steps an architecture, not a measurement.
"""
import argparse, json, os, statistics, sys, time

STARTED = time.perf_counter()
# Lanner's matched-budget rows run under this multiple of the peer's measured peak: the bars' memory bound is
# 1.1x, and the engine's peak has come out up to 0.4% over its budget (gemma2-9b, round 16).
MATCHED_BUDGET = 1.09
# ... and under a hard cap of this multiple of it on the process's GPU memory (--cap-gib): the bar's bound itself,
# on what the allocator reserves (graph pools and cached blocks included), from the first step to the last.
MATCHED_CAP = 1.10
if os.environ.get("BENCH_STACKS_AFTER"):  # a process that may be stopped by a timeout: where it was, on stderr
    import faulthandler
    faulthandler.dump_traceback_later(float(os.environ["BENCH_STACKS_AFTER"]), exit=False)


def device_peak_bytes():
    """The allocator's peak plus what CUDA-graph pools hold beyond their live tensors (Lanner's graphed layers work
    there without allocating; 0 for the peers). Imported here, not at the top: Unsloth must be imported first."""
    from lanner.kernels.memory.graphs import device_peak_bytes
    return device_peak_bytes()


def progress(message):
    """Where the time goes, on stderr (run.py --stream passes it through, also when a process times out)."""
    print(f"[{time.perf_counter() - STARTED:7.1f} s] {message}", file=sys.stderr, flush=True)

CONFIGS = {
    # A few seconds on the CPU (the kernels under TRITON_INTERPRET=1): checks a harness end to end.
    "llama-tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=1024, tie_word_embeddings=True, rope_theta=10000.0,
                       max_position_embeddings=1024),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                     tie_word_embeddings=True, rope_theta=500000.0, max_position_embeddings=8192),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                     tie_word_embeddings=False, rope_theta=500000.0, max_position_embeddings=8192),
    # The families of issue 21 (every dense family at speed). "arch" picks the transformers classes.
    # Mistral-7B v0.1 (sliding window 4096).
    "mistral-7b": dict(arch="mistral", hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, sliding_window=4096,
                       tie_word_embeddings=False, rope_theta=10000.0, max_position_embeddings=32768),
    # A 1B-ish Mistral (the Llama-3.2 1B body, a 32k vocabulary, the 4096 window): quick attention checks.
    "mistral-1b": dict(arch="mistral", hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                       num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, sliding_window=4096,
                       tie_word_embeddings=True, rope_theta=10000.0, max_position_embeddings=32768),
    # Qwen2.5-7B (q/k/v biases, no window).
    "qwen2.5-7b": dict(arch="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       tie_word_embeddings=False, rope_theta=1000000.0, max_position_embeddings=32768),
    # Gemma-2 9B: head_dim 256, attention soft-cap 50, final soft-cap 30, sliding/global layers alternating.
    "gemma2-9b": dict(arch="gemma2", hidden_size=3584, intermediate_size=14336, num_hidden_layers=42,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=256, vocab_size=256000,
                      sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                      query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh",
                      tie_word_embeddings=True, rope_theta=10000.0, max_position_embeddings=8192),
    # Gemma-2 2B: the same attention (d256, soft-caps, alternating windows) at a size that runs in seconds.
    "gemma2-2b": dict(arch="gemma2", hidden_size=2304, intermediate_size=9216, num_hidden_layers=26,
                      num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=256000,
                      sliding_window=4096, attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                      query_pre_attn_scalar=256, hidden_activation="gelu_pytorch_tanh",
                      tie_word_embeddings=True, rope_theta=10000.0, max_position_embeddings=8192),
    # Llama-2 13B: the hidden-size-5k class (issue 23's second shape), full multi-head attention.
    "llama2-13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                       num_attention_heads=40, num_key_value_heads=40, vocab_size=32000,
                       tie_word_embeddings=False, rope_theta=10000.0, max_position_embeddings=4096),
    # Qwen3-8B (q_norm/k_norm).
    "qwen3-8b": dict(arch="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                     tie_word_embeddings=False, rope_theta=1000000.0, max_position_embeddings=40960),
    # The shapes below are the published config.json values of the named checkpoints (Hugging Face hub).
    # Qwen/Qwen2.5-1.5B-Instruct: q/k/v biases, tied embeddings, no window (use_sliding_window false).
    "qwen2.5-1.5b": dict(arch="qwen2", hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=32768),
    # Qwen/Qwen3-1.7B: q_norm/k_norm, head_dim 128 (hidden / heads), tied embeddings.
    "qwen3-1.7b": dict(arch="qwen3", hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                       tie_word_embeddings=True, rope_theta=1000000.0, max_position_embeddings=40960),
    # microsoft/Phi-4-mini-instruct (3.8B, Phi's representative): fused qkv_proj and gate_up_proj, head_dim
    # 128 of which 96 rotate (partial_rotary_factor 0.75), LongRoPE (the long factors apply past 4,096
    # tokens), a 262,144 "window" that never masks anything, tied 200k vocabulary.
    "phi-4-mini": dict(arch="phi3", hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
                       num_attention_heads=24, num_key_value_heads=8, vocab_size=200064, partial_rotary_factor=0.75,
                       rope_theta=10000.0, rope_scaling=dict(type="longrope", short_factor=[1.0] * 48, long_factor=[
                           1, 1.118320672, 1.250641126, 1.398617824, 1.564103225, 1.74916897, 1.956131817,
                           2.187582649, 2.446418898, 2.735880826, 3.059592084, 3.421605075, 3.826451687,
                           4.279200023, 4.785517845, 5.351743533, 5.984965424, 6.693110555, 7.485043894,
                           8.370679318, 9.36110372, 10.4687158, 11.70738129, 13.09260651, 14.64173252,
                           16.37415215, 18.31155283, 20.47818807, 22.90118105, 25.61086418, 28.64115884, 32.03,
                           32.1, 32.13, 32.23, 32.6, 32.61, 32.64, 32.66, 32.7, 32.71, 32.93, 32.97, 33.28,
                           33.49, 33.5, 44.16, 47.77]),
                       max_position_embeddings=131072, original_max_position_embeddings=4096,
                       sliding_window=262144, rms_norm_eps=1e-5, tie_word_embeddings=True, pad_token_id=199999,
                       bos_token_id=199999, eos_token_id=199999),
    # google/gemma-7b (Gemma 1): head_dim 256, full multi-head attention (16 kv heads), no soft-caps, no window,
    # (1 + w) norms, tanh-GeGLU, tied 256k vocabulary.
    "gemma-7b": dict(arch="gemma", hidden_size=3072, intermediate_size=24576, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=16, head_dim=256, vocab_size=256000,
                     hidden_activation="gelu_pytorch_tanh", rope_theta=10000.0, tie_word_embeddings=True,
                     max_position_embeddings=8192),
    # google/gemma-2b (Gemma 1): one key/value head.
    "gemma-2b": dict(arch="gemma", hidden_size=2048, intermediate_size=16384, num_hidden_layers=18,
                     num_attention_heads=8, num_key_value_heads=1, head_dim=256, vocab_size=256000,
                     hidden_activation="gelu_pytorch_tanh", rope_theta=10000.0, tie_word_embeddings=True,
                     max_position_embeddings=8192),
    # google/gemma-3-1b-pt (gemma3_text): head_dim 256, one key/value head, five sliding layers (window 512,
    # RoPE base 10k) to one global (base 1M), q_norm/k_norm, query_pre_attn_scalar 256, no soft-caps.
    "gemma3-1b": dict(arch="gemma3_text", hidden_size=1152, intermediate_size=6912, num_hidden_layers=26,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=256, vocab_size=262144,
                      sliding_window=512, sliding_window_pattern=6, query_pre_attn_scalar=256,
                      attn_logit_softcapping=None, final_logit_softcapping=None,
                      hidden_activation="gelu_pytorch_tanh", rope_theta=1000000.0, rope_local_base_freq=10000.0,
                      tie_word_embeddings=True, max_position_embeddings=32768),
    # google/gemma-3-12b-pt's text_config: as the 1B, with a 1,024 window and linear RoPE scaling (factor 8)
    # on the global layers.
    "gemma3-12b": dict(arch="gemma3_text", hidden_size=3840, intermediate_size=15360, num_hidden_layers=48,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=256, vocab_size=262208,
                       sliding_window=1024, sliding_window_pattern=6, query_pre_attn_scalar=256,
                       attn_logit_softcapping=None, final_logit_softcapping=None,
                       hidden_activation="gelu_pytorch_tanh", rope_theta=1000000.0, rope_local_base_freq=10000.0,
                       rope_scaling=dict(rope_type="linear", factor=8.0),
                       tie_word_embeddings=True, max_position_embeddings=131072),
}
ARCHES = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
          "mistral": ("MistralConfig", "MistralForCausalLM"), "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
          "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "phi3": ("Phi3Config", "Phi3ForCausalLM"),
          "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM"), "gemma": ("GemmaConfig", "GemmaForCausalLM")}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def llama_config(name):
    import copy
    import transformers
    c = copy.deepcopy(CONFIGS[name]); arch = c.pop("arch", "llama")
    c.setdefault("rms_norm_eps", 1e-5 if arch in ("llama", "mistral") else 1e-6)
    if os.environ.get("BENCH_TINY") == "1":
        c = tiny_config(c)
    return getattr(transformers, ARCHES[arch][0])(**c, torch_dtype="bfloat16")


def tiny_config(c):
    """The same architecture at a size the CPU steps in seconds: 2 layers, one key/value head with the shape's
    query heads per key/value head, the real head_dim (so partial rotary rotates the same dims), a 512
    vocabulary, and every length (windows, RoPE ranges) / 64, so that 128 tokens stand for 8,192."""
    per_kv = c["num_attention_heads"] // c["num_key_value_heads"]
    head_dim = c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    c.update(num_hidden_layers=2, num_attention_heads=per_kv, num_key_value_heads=1, hidden_size=per_kv * head_dim,
             intermediate_size=2 * per_kv * head_dim, vocab_size=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    for key in ("sliding_window", "max_position_embeddings", "original_max_position_embeddings"):
        if c.get(key):
            c[key] //= 64
    if "sliding_window_pattern" in c:
        c["sliding_window_pattern"] = 2  # a sliding layer, then a global one
    return c


def device():
    """The GPU; the CPU only for BENCH_TINY checks."""
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def model_class(name):
    import transformers
    return getattr(transformers, ARCHES[CONFIGS[name].get("arch", "llama")][1])


def fresh_model(name, device="cuda", dtype=None):
    """Random-init weights of a CONFIGS shape made in dtype (bf16) on the device, sdpa attention (quicker than
    random_model; the same weights for the same torch seed)."""
    import torch
    with torch.device(device):
        return model_class(name)._from_config(llama_config(name), dtype=dtype or torch.bfloat16,
                                              attn_implementation="sdpa")


def random_model(name):
    """The random weights that saved_dir writes (float32 init under seed 0, then bf16), on the GPU."""
    import torch
    torch.manual_seed(0)
    with torch.device(device()):
        return model_class(name)(llama_config(name)).to(torch.bfloat16)


def saved_dir(name):
    """Random weights saved once, for loaders that need a path (unsloth, 4-bit)."""
    import torch
    d = f"/tmp/rand-{name}"
    if not os.path.exists(os.path.join(d, "tokenizer.json")):
        m = random_model(name)
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
    ap.add_argument("--graphs", choices=["on", "off"], default="on", help="lanner: CUDA graphs of the layers")
    ap.add_argument("--memory-profile", default=None,
                    help="write memory_profile.py's report of the last step's peak to this file")
    ap.add_argument("--kernel-profile", default=None,
                    help="write the GPU time of the last two steps by kernel (torch.profiler) to this file")
    ap.add_argument("--long-context", default=None, metavar="S1,S2,...",
                    help="instead of timing: the peak of a batch-1 step at each length, and the longest "
                         "sequence that fits 24/48/80 GiB from a line through them (see long_context)")
    ap.add_argument("--check-at", type=int, default=None,
                    help="--long-context: check this length under the first budget instead of the predicted one")
    ap.add_argument("--fits", default=None, metavar="GIB:S1,S2,...",
                    help="instead of timing: one batch-1 step at each length (ascending) with the allocator capped "
                         "at GIB (after one step at 8,192 tokens), reporting its peak, up to the first that runs "
                         "out of memory")
    ap.add_argument("--cap-gib", type=float, default=None,
                    help="a hard cap on the GPU memory this process's allocator may reserve for the steps (every "
                         "pool, the CUDA graphs' too): a row that finishes under it needed no more at any moment; "
                         "one that does not fails with the allocator's out-of-memory error")
    ap.add_argument("--same-weights", action="store_true",
                    help="lanner, hf, liger: start from exactly the weights saved_dir writes (the loaders' "
                         "weights), so that losses compare with unsloth's step for step")
    a = ap.parse_args()
    if a.fits:
        cap, lengths = a.fits.split(":")
        a.fits = float(cap), [int(s) for s in lengths.split(",")]
    if a.long_context or a.fits:
        # Unsloth sizes its RoPE cache from it: room for the checked lengths
        a.seq = max([131072, *(a.fits[1] if a.fits else [])])
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.graphs == "off":
        os.environ["LANNER_CUDA_GRAPHS"] = "0"
    import torch
    if a.mode.startswith("unsloth"):
        import unsloth  # noqa: F401  (must precede transformers)
        from unsloth import FastLanguageModel
    from transformers import BitsAndBytesConfig
    LlamaForCausalLM = model_class(a.model)
    from peft import LoraConfig, get_peft_model
    progress(f"{a.mode} {a.model} seq {a.seq} x {a.bs}: imports done")

    if a.mode == "liger":
        import liger_kernel.transformers as liger
        arch = CONFIGS[a.model].get("arch", "llama")
        options = dict(rope=True, rms_norm=True, cross_entropy=False, fused_linear_cross_entropy=True)
        if arch.startswith("gemma"):
            options["geglu"] = True
        else:
            options["swiglu"] = True
        getattr(liger, f"apply_liger_kernel_to_{arch}")(**options)  # gemma3_text: the text-only patch
    torch.manual_seed(0)
    gc = a.mode != "hfnogc"
    if a.mode.startswith("unsloth"):
        model, _ = FastLanguageModel.from_pretrained(
            saved_dir(a.model), max_seq_length=a.seq, dtype=torch.bfloat16,
            load_in_4bit=a.mode == "unsloth4", local_files_only=True)
        model = FastLanguageModel.get_peft_model(
            model, r=a.rank, lora_alpha=a.rank, lora_dropout=0, bias="none",
            target_modules=TARGETS, use_gradient_checkpointing="unsloth")
    elif a.mode in ("lanner", "lanner8"):
        from lanner.kernels import get_lora_model
        from lanner.kernels.memory import use_expandable_segments
        use_expandable_segments()  # what get_lora_model does before it loads a model, here built before it
        if a.same_weights:
            model = random_model(a.model)  # patch_model switches its attention to "lanner" whatever it was
        else:
            model = fresh_model(a.model, device())
        offload = {"on": True, "off": False, "auto": None}[a.offload]
        model = get_lora_model(model, r=a.rank, lora_alpha=a.rank, target_modules=TARGETS,
                               lora_dropout=0.0, gradient_checkpointing=gc, bias="none",
                               memory_budget_gib=a.budget, offload_checkpoints=offload,
                               load_in_fp8=a.mode == "lanner8")  # converted on the GPU, layer by layer
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
        elif a.same_weights:
            model = random_model(a.model)
            try:
                model.set_attn_implementation("sdpa")
            except (AttributeError, ValueError):
                pass
        else:
            model = fresh_model(a.model, device())
        if gc:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=a.rank, lora_dropout=0.0,
                                                 bias="none", target_modules=TARGETS,
                                                 task_type="CAUSAL_LM"))
    model.train()
    progress("model ready (created or loaded, LoRA attached)")
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    vocab = model.config.vocab_size
    g = torch.Generator(device=device()).manual_seed(1)
    if a.long_context or a.fits:
        return long_context(model, opt, [int(s) for s in (a.long_context or "").split(",") if s], vocab, g, a)
    batches = [torch.randint(0, vocab, (a.bs, a.seq), device=device(), generator=g) for _ in range(4)]
    if a.memory_profile:
        from memory_profile import MARKER_BYTES, PhasePeaks, analyse
        phases = PhasePeaks(model)
    gpu = torch.cuda.is_available()
    synchronize = torch.cuda.synchronize if gpu else (lambda: None)
    if gpu:  # (the cache the model's creation left, in float32, would otherwise stand as the reserved peak)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        if a.cap_gib:
            torch.cuda.set_per_process_memory_fraction(
                min(1.0, a.cap_gib * 2**30 / torch.cuda.get_device_properties(0).total_memory))
    times, loss, losses = [], None, []
    held_by_step, peak_by_step = [], []  # GiB allocated as each step starts; the peak so far after it
    # The warm-up steps' peak, apart from the timed steps' (a graph capture's eager warm-up runs in the first
    # graphed step, and the pool counted after it may not yet have held its working memory then: an upper bound).
    warmup_peak = warmup_allocated_peak = 0
    for i in range(a.warmup + a.steps):
        ids = batches[i % len(batches)]
        if gpu and i == a.warmup:
            warmup_peak, warmup_allocated_peak = device_peak_bytes(), torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        held_by_step.append(round(torch.cuda.memory_allocated() / 2**30, 3))
        profiled = a.memory_profile and i == a.warmup + a.steps - 1
        if a.kernel_profile and i == a.warmup + a.steps - 2:
            kernel_profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
                record_shapes=True)
            kernel_profiler.__enter__()
        if profiled:
            overall_peak = torch.cuda.max_memory_allocated()
            baseline = torch.cuda.memory_allocated()
            torch.cuda.memory._record_memory_history(stacks="python", max_entries=3_000_000)
            torch.empty(MARKER_BYTES, dtype=torch.uint8, device="cuda")
            phases.active = True
            phases.mark("step starts")
        synchronize(); t = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        if profiled:
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            phases.mark("loss computed")
        out.loss.backward()
        if profiled:
            phases.mark("backward done")
        opt.step(); opt.zero_grad(set_to_none=True)
        if profiled:
            phases.mark("optimizer step done")
            phases.active = False
        synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t)
        peak_by_step.append(round(max(warmup_peak, device_peak_bytes()) / 2**30, 3))  # (after the timing: it reads a snapshot)
        loss = out.loss.item()
        losses.append(round(loss, 4))
        progress(f"step {i} ({'warm-up' if i < a.warmup else 'timed'}): {time.perf_counter() - t:.2f} s, "
                 f"loss {loss:.4f}, peak {peak_by_step[-1]:.2f} GiB")
    ms = statistics.median(times) * 1000
    if a.kernel_profile:
        kernel_profiler.__exit__(None, None, None)
        write_kernel_profile(kernel_profiler, a.kernel_profile, steps=2)
    if a.memory_profile:
        with open(a.memory_profile, "w") as handle:
            handle.write(f"{a.mode} {a.model} budget={a.budget} offload={a.offload} peak of the steps before "
                         f"the profiled one: {overall_peak / 2**30:.3f} GiB\n{phases.report()}\n\nforward:\n"
                         f"{analyse(snapshot, baseline=baseline)}\n")
    extra = {}
    if a.mode in ("lanner", "lanner4", "lanner8"):
        from lanner.kernels.memory import memory_engine_of
        engine = memory_engine_of(model)
        if engine is not None and engine.plan is not None:
            plan = engine.plan
            graphs = engine.graphs
            graphed = bool(engine.graphs_allowed and graphs.graphed_forwards and graphs.off_reason is None)
            extra = dict(budget=a.budget, offload=a.offload, graphs=graphed,
                         predicted_peak_gib=round(plan.predicted_peak_bytes / 2**30, 2),
                         plan=" ".join(p.code for p in plan.layers))
    if a.cap_gib:
        extra["cap_gib"] = a.cap_gib
    print(json.dumps(dict(**extra, mode=a.mode, model=a.model, seq=a.seq, bs=a.bs, rank=a.rank,
                          step_ms=round(ms, 1), tok_s=round(a.bs * a.seq / ms * 1000),
                          peak_gib=round(max(warmup_peak, device_peak_bytes()) / 2**30, 2),
                          timed_peak_gib=round(device_peak_bytes() / 2**30, 2),
                          allocated_peak_gib=round(max(warmup_allocated_peak, torch.cuda.max_memory_allocated())
                                                   / 2**30, 2),
                          reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 2),
                          loss=round(loss, 4), losses=losses, same_weights=a.same_weights,
                          process_s=round(time.perf_counter() - STARTED, 1), gpu=torch.cuda.get_device_name() if gpu else "cpu",
                          held_by_step=held_by_step, peak_by_step=peak_by_step)), flush=True)


def write_kernel_profile(profiler, path, steps):
    """GPU time by kernel name, per step, largest first, and the sum (what the GPU was busy with); the whole
    timeline beside it as PATH.trace.json.gz (Chrome/Perfetto format: where the GPU waited on the host)."""
    import gzip
    import shutil
    import tempfile

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        profiler.export_chrome_trace(trace.name)
        with open(trace.name, "rb") as plain, gzip.open(f"{path}.trace.json.gz", "wb") as packed:
            shutil.copyfileobj(plain, packed)
    totals = {}
    for event in profiler.events():
        if event.device_type.name == "CUDA":
            totals[event.name] = totals.get(event.name, 0.0) + event.time_range.elapsed_us() / 1000 / steps
    busy = sum(totals.values())
    with open(path, "w") as handle:
        handle.write(f"GPU busy {busy:.1f} ms a step (kernels and copies, summed)\n")
        for name, ms in sorted(totals.items(), key=lambda item: -item[1]):
            handle.write(f"{ms:9.3f} ms {100 * ms / busy:5.1f}%  {name[:160]}\n")
        for sort_by in ("self_device_time_total", "self_cuda_time_total"):
            try:
                table = profiler.key_averages(group_by_input_shape=True).table(sort_by=sort_by, row_limit=80,
                                                                               max_name_column_width=60)
            except (AttributeError, KeyError, ValueError):
                continue
            handle.write(f"\nby operator and input shapes, both steps ({sort_by}):\n{table}\n")
            break


def long_context(model, opt, seqs, vocab, generator, a, budgets=(24, 48, 80)):
    """Peak memory is linear in the sequence length for these engines (flash attention, chunked loss,
    checkpointed layers), so two or more measured lengths give the line; its crossing with each
    budget is the longest sequence predicted to fit. Then one step at each checked length with the
    allocator capped (set_per_process_memory_fraction): --fits' lengths and cap, else the first
    budget's predicted length (or --check-at). Each result is printed as it comes."""
    import gc
    import torch

    def step(seq):
        ids = torch.randint(0, vocab, (1, seq), device="cuda", generator=generator)
        torch.cuda.reset_peak_memory_stats()
        t = time.perf_counter()
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        del out
        seconds = time.perf_counter() - t
        return device_peak_bytes(), seconds

    points = []
    for seq in seqs:
        step(seq)  # the first step at a new length plans (lanner) or compiles (unsloth)
        peak, seconds = step(seq)
        points.append((seq, peak))
        print(json.dumps(dict(mode=a.mode, seq=seq, peak_gib=round(peak / 2**30, 3), step_s=round(seconds, 2))), flush=True)
    if len(points) >= 2:
        n = len(points)
        mean_x = sum(x for x, _ in points) / n
        mean_y = sum(y for _, y in points) / n
        slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
        intercept = mean_y - slope * mean_x
        predicted = {b: int((b * 2**30 - intercept) / slope) // 1024 * 1024 for b in budgets}
        print(json.dumps(dict(mode=a.mode, model=a.model, bytes_per_token=round(slope),
                              fixed_gib=round(intercept / 2**30, 3),
                              max_seq={str(b): v for b, v in predicted.items()})), flush=True)
    cap, checked = a.fits or (budgets[0], [a.check_at or predicted[budgets[0]]])
    if not points:
        step(8192)  # plan (lanner) or compile (unsloth) at a short length first
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(cap * 2**30 / total)
    for seq in checked:
        try:
            peak, seconds = step(seq)
            check = dict(fits=True, peak_gib=round(peak / 2**30, 3), step_s=round(seconds, 1))
        except torch.OutOfMemoryError:
            check = dict(fits=False)
            opt.zero_grad(set_to_none=True)
            gc.collect()
            torch.cuda.empty_cache()
        print(json.dumps(dict(mode=a.mode, model=a.model, check_at=dict(budget_gib=cap, seq=seq, **check))), flush=True)
        if not check["fits"]:
            break  # the longer ones would not fit either


if __name__ == "__main__":
    sys.exit(main())
