"""The trainer's arguments of a job: training_options(spec), one pure function of the job's spec
(lanner.core.spec), in the names TRL and PEFT take. The spec holds every default; nothing here has one."""
from __future__ import annotations

from dataclasses import dataclass, replace

from lanner.core.spec import GrpoSettings, JobSpec, fp8_base, quantized_base, trains_adapter

# KTO estimates its KL term from the other completions of a micro-batch: it needs two at least.
SMALLEST_MICRO_BATCH = {"kto": 2}
# The spec's precision as a torch dtype name ("auto": bfloat16 on a GPU that has it, else float32).
DTYPES = {"auto": "auto", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class TrainingOptions:
    method: str
    lora: bool                          # train a LoRA adapter; False: every weight
    load_in_4bit: bool                  # the adapter over a 4-bit NF4 base (qlora; grpo's load_in_4bit)
    load_in_fp8: bool                   # the adapter over a base stored and multiplied in FP8 (lora_fp8)
    max_steps: int                      # > 0 overrides num_train_epochs
    num_train_epochs: float
    per_device_train_batch_size: int
    gradient_accumulation_steps: int
    learning_rate: float
    lr_scheduler_type: str
    warmup_ratio: float
    weight_decay: float
    max_grad_norm: float
    max_seq_length: int
    packing: bool                       # padding-free: samples packed into rows, attention within each (sft.py)
    completion_only_loss: bool
    chat_template: str | None           # a Jinja chat template replacing the model's own
    lora_r: int | None                  # the LoRA settings: None when every weight trains
    lora_alpha: float | None
    lora_dropout: float | None
    target_modules: list[str] | None    # None: every linear projection of the decoder layers
    gradient_checkpointing: bool
    use_kernels: bool
    memory_budget_gib: float | None     # lora/qlora: the memory engine's budget (model.py, docs/memory-engine.md)
    offload_checkpoints: bool
    dtype: str
    seed: int
    validation_split: float
    eval_steps: int
    save_steps: int
    beta: float | None                  # the beta of every preference method (ORPO's lambda, KTO's beta)
    max_prompt_len: int | None          # preference methods: longer prompts keep their end (common.truncate_prompts)
    oom_retry: bool
    memory_limit_mb: int | None         # a cap on what the training steps may allocate (lanner.worker.training.memory)
    before_after_eval: bool
    grpo: GrpoSettings | None           # grpo: the reward functions and the sampling (grpo.py)

    def problem(self) -> str | None:
        """Why these options cannot train, in words; None when they can."""
        smallest = SMALLEST_MICRO_BATCH.get(self.method, 1)
        if self.per_device_train_batch_size < smallest:
            return (f"{self.method.upper()} needs a micro-batch (per_device_train_batch_size) of {smallest} or more: "
                    f"its KL term compares each completion with the others in its micro-batch.")
        return None

    def with_micro_batch(self, micro_batch: int) -> "TrainingOptions":
        """The same effective batch (micro-batch x accumulation) at a smaller micro-batch that divides it."""
        effective = self.per_device_train_batch_size * self.gradient_accumulation_steps
        assert effective % micro_batch == 0, (effective, micro_batch)
        return replace(self, per_device_train_batch_size=micro_batch,
                       gradient_accumulation_steps=effective // micro_batch)


def training_options(spec: JobSpec) -> TrainingOptions:
    hp, lora, preference = spec.hyperparameters, spec.lora if trains_adapter(spec) else None, spec.preference
    return TrainingOptions(
        method=spec.method, lora=lora is not None, load_in_4bit=quantized_base(spec), load_in_fp8=fp8_base(spec),
        max_steps=hp.max_steps or -1, num_train_epochs=hp.epochs,
        per_device_train_batch_size=hp.batch_size, gradient_accumulation_steps=hp.gradient_accumulation,
        learning_rate=hp.learning_rate, lr_scheduler_type=hp.lr_scheduler, warmup_ratio=hp.warmup_ratio,
        weight_decay=hp.weight_decay, max_grad_norm=hp.max_grad_norm, max_seq_length=hp.max_seq_len,
        packing=hp.packing, completion_only_loss=hp.completion_only_loss, chat_template=spec.chat_template,
        lora_r=lora and lora.rank, lora_alpha=lora and lora.alpha, lora_dropout=lora and lora.dropout,
        target_modules=None if lora is None or lora.target_modules == "all-linear" else list(lora.target_modules),
        gradient_checkpointing=hp.gradient_checkpointing, use_kernels=hp.use_kernels,
        memory_budget_gib=hp.memory_budget_gib, offload_checkpoints=hp.offload_checkpoints,
        dtype=DTYPES[hp.precision], seed=hp.seed, validation_split=hp.eval_fraction,
        eval_steps=hp.eval_steps or hp.save_steps, save_steps=hp.save_steps,
        beta=preference and preference.beta, max_prompt_len=preference and preference.max_prompt_len,
        oom_retry=hp.oom_retry, memory_limit_mb=hp.memory_limit_mb, before_after_eval=hp.before_after_eval,
        grpo=spec.grpo)
