"""What every method's trainer shares: the seeded validation split and the TrainingArguments fields."""
from __future__ import annotations

from typing import Any

import torch
from datasets import Dataset, Features, Json

from lanner.core import tool_turns
from lanner.core.dataset_formats import ANSWERS
from lanner.core.spec import MIN_ROWS_FOR_VALIDATION
from lanner.worker.distributed.ranks import trainer_args
from lanner.worker.job_process import JobFailed
from lanner.worker.training.callbacks import MetricsCallback
from lanner.worker.training.options import TrainingOptions


def split(rows: list[dict], options: TrainingOptions) -> tuple[Dataset, Dataset | None]:
    """A seeded validation split, when the dataset is big enough for one to mean something."""
    dataset = _dataset(rows)
    if len(rows) < MIN_ROWS_FOR_VALIDATION or options.validation_split <= 0:
        return dataset, None
    parts = dataset.train_test_split(test_size=options.validation_split, seed=options.seed)
    return parts["train"], parts["test"]


def _dataset(rows: list[dict]) -> Dataset:
    """The rows as a Dataset. Conversations that call tools are stored as JSON: Arrow would give each call's
    arguments (and each tool's schema) the keys of every other's, as nulls, which the chat template would render."""
    if not any("tools" in row or tool_turns.has_tool_turns(_messages_of(row)) for row in rows):
        return Dataset.from_list(rows)
    columns = dict.fromkeys(key for row in rows for key in row)
    return Dataset.from_dict({key: [row.get(key) for row in rows] for key in columns},
                             features=Features({key: Json() for key in columns}))


def _messages_of(row: dict) -> list[dict]:
    return [message for name in ("prompt", *ANSWERS) if isinstance(row.get(name), list)
            for message in row[name]]


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
    while len(messages) > 1 and _template_length(tokenizer, messages, ask=True) > max_tokens:
        del messages[1 if messages[0].get("role") == "system" and len(messages) > 2 else 0]
    return messages


def job_events(callbacks: list):
    """The job's events, from the callbacks the training process passes (None in a bare trainer)."""
    return next((callback.events for callback in callbacks if isinstance(callback, MetricsCallback)), None)


def rows_the_template_takes(rows: list[dict], tokenizer, callbacks: list) -> list[dict]:
    """The conversational rows the chat template renders. A template may refuse a conversation in words
    (raise_exception: roles that do not alternate, a system turn it has no place for), which would end the
    job at the first such row wherever it is; those rows are left out and counted instead, with the
    template's reason, and none taken fails the job with it. Templates refuse by the roles' order (and the
    number of tool calls a turn: Llama 3.1's takes one), so one row of each such shape is rendered. A template
    that leaves tool calls or a tool's answers out of the text (one written for plain chat) refuses the rows
    that have them: trained, they would teach empty turns."""
    from jinja2.exceptions import TemplateError

    refused: dict[tuple, str | None] = {}
    kept, reasons = [], []
    for row in rows:
        if not isinstance(row.get("prompt"), list):  # text rows, and prompts of text: no template
            kept.append(row)
            continue
        answers = [row[name] for name in ANSWERS if isinstance(row.get(name), list)]
        key = (bool(row.get("tools")), *(tuple((message["role"], len(message.get("tool_calls", ())))
                                               for message in part) for part in (row["prompt"], *answers)))
        if key not in refused:
            try:
                tools = row.get("tools")
                tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True, tools=tools)
                refused[key] = None
                for answer in answers:
                    tokenizer.apply_chat_template(row["prompt"] + answer, tokenize=False, tools=tools)
                    refused[key] = refused[key] or tool_turns.left_out(tokenizer, row["prompt"] + answer, tools)
            except TemplateError as error:
                refused[key] = str(error)
        if refused[key] is None:
            kept.append(row)
        else:
            reasons.append(refused[key])
    if not reasons:
        return rows
    if not kept:
        raise JobFailed(f"The chat template refuses every row: {reasons[0]}")
    events = job_events(callbacks)
    if events is not None:
        events.log(f"{len(reasons)} of {len(rows)} rows were left out: the chat template refuses them "
                   f"(first: {reasons[0]})", level="warning")
    return kept


def _template_length(tokenizer, conversation: list[dict], *, ask: bool) -> int:
    ids = tokenizer.apply_chat_template(conversation, tokenize=True, add_generation_prompt=ask)
    return len(ids["input_ids"] if hasattr(ids, "keys") else ids)


def rows_that_fit(rows: list[dict], tokenizer, options: TrainingOptions, callbacks: list, *,
                  whole: bool = False) -> list[dict]:
    """The preference (and KTO) rows the chat template takes (rows_the_template_takes), their prompts cut to
    max_prompt_len (truncate_prompts), that leave something of their answers to learn within max_seq_length
    once the chat template is applied: a prompt shorter than it (whole: prompt and answer within it, each
    answer, as the reward model's pairs must be, their prompts uncut). TRL's trainers drop the others
    without a word (DPO, KTO, reward: no row left is an error about num_samples, or no step at all) or
    train on them as NaN (ORPO). How many were left out is logged; none fitting fails the job in words."""
    rows = rows_the_template_takes(rows, tokenizer, callbacks)
    if not whole:
        rows = truncate_prompts(rows, tokenizer, options.max_prompt_len)
    limit = options.max_seq_length

    def fits(row: dict) -> bool:
        if not whole:
            return _template_length(tokenizer, row["prompt"], ask=True) < limit
        return all(_template_length(tokenizer, row["prompt"] + row[answer], ask=False) <= limit
                   for answer in ("chosen", "rejected", "completion") if answer in row)

    kept = [row for row in rows if fits(row)]
    if not kept:
        what = "fits whole (prompt and answers)" if whole else "has any of its answer"
        raise JobFailed(f"No row {what} within max_seq_len ({limit} tokens) once the chat template is applied: "
                        "raise max_seq_len or shorten the " + ("rows." if whole else
                                                                "prompts (or set preference.max_prompt_len)."))
    events = job_events(callbacks)
    if len(kept) < len(rows) and events is not None:
        events.log(f"{len(rows) - len(kept)} of {len(rows)} rows were left out: "
                   f"{'they do not fit whole' if whole else 'none of their answer fits'} within max_seq_len "
                   f"({limit} tokens)", level="warning")
    return kept


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
