"""The model a job trains: resolved from its id, loaded on this process's device, wrapped with LoRA
(over a 4-bit base for QLoRA, an FP8 one for lora_fp8) or trained whole, and put on lanner.kernels when the job wants them and
they can run here."""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from lanner.core.settings import Settings
from lanner.core.default_model import DEFAULT_MODEL_ID, imported_model_dir
from lanner.core.memory_estimate import default_budget_bytes
from lanner.core.spec import MEMORY_ENGINE_METHODS, REWARD_MODEL_METHODS
from lanner.worker.checkpoints import base_load_kwargs
from lanner.worker.events import JobEvents
from lanner.worker.job_process import JobFailed
from lanner.worker.training.options import TrainingOptions


def resolve_model(model: str, settings: Settings) -> str:
    """The built-in model's imported copy, a local path, or a hub id (as given)."""
    if model == DEFAULT_MODEL_ID:
        return str(imported_model_dir(settings.models_dir))
    local = Path(model).expanduser()
    if not local.is_absolute():
        local = settings.models_dir / model
    return str(local) if local.exists() else model


def training_dtype(options: TrainingOptions) -> torch.dtype:
    if options.dtype != "auto":
        return getattr(torch, options.dtype)
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_tokenizer(path: str, options: TrainingOptions):
    tokenizer = AutoTokenizer.from_pretrained(path)
    if options.chat_template:
        tokenizer.chat_template = options.chat_template
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(path: str, options: TrainingOptions, events: JobEvents, base=None):
    """The model the job's method trains, on the kernels unless the job switched them off. base: a causal
    LM already on this process's device (benchmarks/grpo_bench.py's random weights) instead of loading
    path; for LoRA and every-weight training only."""
    assert base is None or not (options.method in REWARD_MODEL_METHODS or options.load_in_4bit or options.load_in_fp8)
    if options.use_kernels and torch.cuda.is_available():
        from lanner.kernels.memory import use_expandable_segments

        use_expandable_segments()  # before the weights take their segments (the memory engine's plans count on it)
    if options.method in REWARD_MODEL_METHODS:
        model = _load_scorer(path, options)
        if options.lora:
            model, how = _lora_scorer(model, options), "reward model: LoRA and the score head"
        else:
            model, how = _whole_model(model, options), "reward model: every weight"
    elif options.load_in_4bit:
        model, how = _nf4_lora_model(path, options), "LoRA over a 4-bit NF4 base"
    elif options.load_in_fp8:
        model, how = _fp8_lora_model(path, options), "LoRA over an FP8 base"
    elif options.lora:
        model, how = _lora_model(_load(path, options) if base is None else base, options), "LoRA"
    else:
        model, how = _whole_model(_load(path, options) if base is None else base, options), "every weight"
    report = _put_on_kernels(model, options, events)
    if options.method in MEMORY_ENGINE_METHODS:
        _start_memory_engine(model, options, events, report)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    dtype = str(training_dtype(options)).removeprefix("torch.")
    events.log(f"Model {path} ({how}) in {dtype}: {trainable:,} trainable of {total:,} parameters; "
               f"gradient checkpointing {'on' if options.gradient_checkpointing else 'off'}")
    return model


def _load(path: str, options: TrainingOptions):
    # On the device before patching: the kernels check the device the weights are on.
    return AutoModelForCausalLM.from_pretrained(path, dtype=training_dtype(options), **base_load_kwargs(path)).to(device())


def _load_scorer(path: str, options: TrainingOptions):
    """The base with a score head of one output (a new linear layer over the last hidden state) in place
    of its language-model head; the padding token tells it where each sequence ends."""
    tokenizer = load_tokenizer(path, options)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=training_dtype(options))
    model.config.pad_token_id = tokenizer.pad_token_id
    return model.to(device())


def _lora_scorer(model, options: TrainingOptions):
    """LoRA on the same projections as an adapter job, and the score head trained whole (PEFT's
    sequence-classification task saves it with the adapter). lanner.kernels' get_lora_model makes
    causal LMs only."""
    from peft import LoraConfig, get_peft_model

    from lanner.kernels import DEFAULT_TARGET_MODULES
    from lanner.kernels.patching.families import family_of, family_target_modules

    if options.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    targets = options.target_modules or DEFAULT_TARGET_MODULES
    config = LoraConfig(r=options.lora_r, lora_alpha=options.lora_alpha, lora_dropout=options.lora_dropout,
                        target_modules=family_target_modules(family_of(model), targets), task_type="SEQ_CLS",
                        modules_to_save=["score"])
    return get_peft_model(model, config)


def _lora_model(model_or_path, options: TrainingOptions, **kwargs):
    from lanner.kernels import DEFAULT_TARGET_MODULES, get_lora_model

    return get_lora_model(model_or_path, r=options.lora_r, lora_alpha=options.lora_alpha,
                          target_modules=options.target_modules or DEFAULT_TARGET_MODULES,
                          lora_dropout=options.lora_dropout, use_kernels=False,
                          gradient_checkpointing=options.gradient_checkpointing, **kwargs)


def _nf4_lora_model(path: str, options: TrainingOptions):
    """QLoRA through lanner.kernels: every linear layer but the head stored in 4-bit NF4 (bitsandbytes'
    format, double-quantised statistics), quantised on load on this process's device and dequantised
    on use in the training dtype; LoRA trained over it."""
    return _lora_model(path, options, load_in_4bit=True,
                       model_kwargs={"dtype": training_dtype(options), **base_load_kwargs(path)})


def _fp8_lora_model(path: str, options: TrainingOptions):
    """LoRA over an FP8 base through lanner.kernels: every linear layer but the head stored in e4m3 with a
    scale per output channel, converted on load on this process's device, multiplied in FP8 on the tensor
    cores (docs/fp8.md). A GPU without FP8 fails the job in words (compute capability 8.9 or newer); on
    the CPU an exact float32 emulation runs (the tests' path)."""
    from lanner.kernels.ops.fp8_matmul import FP8Unsupported

    try:
        return _lora_model(path, options, load_in_fp8=True,
                           model_kwargs={"dtype": training_dtype(options), **base_load_kwargs(path)})
    except FP8Unsupported as error:
        raise JobFailed(str(error)) from None


def _whole_model(model, options: TrainingOptions):
    """Every weight trained. Checkpointing each decoder layer trades a second forward for not keeping
    the activations, which is what makes a whole-model run fit where a LoRA one does."""
    if options.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    model.requires_grad_(True)
    return model


def _put_on_kernels(model, options: TrainingOptions, events: JobEvents):
    """patch_model's report (None with use_kernels off), in one log line."""
    from lanner.kernels import patch_model

    if not options.use_kernels:
        events.log("lanner.kernels: off (the job's use_kernels option); plain PyTorch and PEFT")
        _dense_experts(model, events)
        return None
    report = patch_model(model)
    if report.active:
        events.log(f"lanner.kernels: on for {report.family} ({dict(report.patched)})")
    else:
        events.log(f"lanner.kernels: not used — {report.fallback_reason}; plain PyTorch and PEFT", level="warning")
    return report


def _dense_experts(model, events: JobEvents) -> None:
    """A 4-bit base's experts back in 16 bits: lanner.kernels stores a mixture's experts in NF4 too, which only
    its grouped kernels train on."""
    from lanner.kernels.quant.nf4_experts import dense_experts_

    layers = dense_experts_(model)
    if layers:
        events.log(f"The experts of {layers} layers are back in 16 bits: 4-bit experts train on lanner.kernels only")


def _start_memory_engine(model, options: TrainingOptions, events: JobEvents, report) -> None:
    """lanner.kernels' memory engine on an adapter's decoder layers (docs/memory-engine.md), as
    get_lora_model(use_kernels=True) puts it: whenever the kernels run, or the job sets a budget or
    offloading. Its plan, made at the first training step, goes to the job's log."""
    from lanner.kernels import install_memory_engine

    asked = options.memory_budget_gib is not None or options.offload_checkpoints
    if report is None or not options.gradient_checkpointing or not options.lora:
        if asked:
            events.log("Memory engine (lanner.kernels): memory_budget_gib and offload_checkpoints ignored; they need "
                       "a LoRA adapter, use_kernels and gradient_checkpointing on", level="warning")
        return
    offload = options.offload_checkpoints or None  # off: only when the budget needs it
    on_gpu = next(model.parameters()).device.type == "cuda"
    if offload and not on_gpu:
        events.log("Memory engine (lanner.kernels): offload_checkpoints ignored on the CPU (it moves layer inputs "
                   "from the GPU to host memory)", level="warning")
        offload = None
    budget, picked = options.memory_budget_gib, False
    if budget is None and report.active and on_gpu:
        budget, picked = default_budget_bytes(torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0],
                                              options.memory_limit_mb) / 2**30, True
    if not (report.active or budget is not None or offload):
        return
    engine = install_memory_engine(model, budget, offload)
    if engine is None:
        events.log("Memory engine (lanner.kernels): not used — the model's decoder layers have no checkpointing hook",
                   level="warning")
        return
    if budget is None:
        how = "no budget: every layer recomputed"
    else:
        how = (f"budget {budget:.1f} GiB" + (", picked from the device's free memory" if picked else "")
               + ("" if offload else ", offloading if the budget needs it"))
    if offload:
        how += ", layer inputs in host memory"
    events.log(f"Memory engine (lanner.kernels): on ({how}); the plan follows at the first training step")
    last = [None]

    def log_new_plan(module, args, output):  # the engine plans again when a batch has more tokens
        if engine.plan is not last[0]:
            last[0] = engine.plan
            events.log(engine.plan.describe(), level="info" if engine.plan.fits else "warning")

    model.register_forward_hook(log_new_plan)
