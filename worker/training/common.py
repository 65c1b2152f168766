"""What every method's trainer shares: the seeded validation split and the TrainingArguments fields."""
from __future__ import annotations

from typing import Any

import torch
from datasets import Dataset

from lanner.core.spec import MIN_ROWS_FOR_VALIDATION
from lanner.worker.distributed.ranks import trainer_args
from lanner.worker.training.options import TrainingOptions


def split(rows: list[dict], options: TrainingOptions) -> tuple[Dataset, Dataset | None]:
    """A seeded validation split, when the dataset is big enough for one to mean something."""
    dataset = Dataset.from_list(rows)
    if len(rows) < MIN_ROWS_FOR_VALIDATION or options.validation_split <= 0:
        return dataset, None
    parts = dataset.train_test_split(test_size=options.validation_split, seed=options.seed)
    return parts["train"], parts["test"]


def truncate_prompts(rows: list[dict], tokenizer, max_tokens: int | None) -> list[dict]:
    """Preference rows whose prompt is longer than max_tokens keep its end, the part nearest the
    answers: a text prompt its last max_tokens tokens, a conversation its latest messages (a leading
    system message stays; a last message longer than the limit is left to max_seq_length)."""
    if not max_tokens:
        return rows
    return [{**row, "prompt": _truncated(row["prompt"], tokenizer, max_tokens)} if "prompt" in row else row
            for row in rows]


def _truncated(prompt, tokenizer, max_tokens: int):
    if isinstance(prompt, str):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        return prompt if len(ids) <= max_tokens else tokenizer.decode(ids[-max_tokens:])
    messages = list(prompt)

    def length(conversation) -> int:
        ids = tokenizer.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True)
        return len(ids["input_ids"] if hasattr(ids, "keys") else ids)

    while len(messages) > 1 and length(messages) > max_tokens:
        del messages[1 if messages[0].get("role") == "system" and len(messages) > 2 else 0]
    return messages


def common_args(options: TrainingOptions, output_dir: str, has_eval: bool) -> dict[str, Any]:
    cuda = torch.cuda.is_available()
    return dict(
        output_dir=output_dir,
        max_steps=options.max_steps,
        num_train_epochs=options.num_train_epochs,
        per_device_train_batch_size=options.per_device_train_batch_size,
        per_device_eval_batch_size=options.per_device_train_batch_size,
        gradient_accumulation_steps=options.gradient_accumulation_steps,
        learning_rate=options.learning_rate,
        lr_scheduler_type=options.lr_scheduler_type,
        # transformers 5 reads a float below 1 as a fraction of the total steps (warmup_ratio is gone).
        warmup_steps=min(float(options.warmup_ratio), 0.99),
        weight_decay=options.weight_decay,
        max_grad_norm=options.max_grad_norm,
        max_length=options.max_seq_length,
        logging_steps=1,
        save_strategy="steps",
        save_steps=options.save_steps,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=options.eval_steps,
        seed=options.seed,
        data_seed=options.seed,
        # The model arrives with checkpointing already set as the job asked (lanner.worker.training.model).
        gradient_checkpointing=False,
        bf16=cuda and options.dtype in ("auto", "bfloat16") and torch.cuda.is_bf16_supported(),
        fp16=False,
        use_cpu=not cuda,
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        **trainer_args(cuda),  # a multi-GPU job's share: DDP or FSDP (lanner.worker.distributed.ranks)
    )
