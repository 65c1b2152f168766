"""Supervised fine-tuning (lora, qlora, full) and continued pretraining on raw text (pretrain) with
TRL's SFTTrainer, on whatever model.py built (an adapter, or every weight): prompt/completion rows
through the model's chat template with the loss on the completions, or text rows for plain language
modelling.

Packing is padding-free: TRL's best-fit-decreasing packing fills rows of max_seq_length with whole
samples, and its padding-free collator gives the batch as one row with position ids restarting at
each sample, the first label of each sample ignored, and no attention mask. From those position ids
transformers builds a block-diagonal causal mask (sdpa, eager) or takes flash attention's varlen
path, and lanner.kernels' RoPE rotates each sample by its own positions: no sample attends to another
(tests/worker/test_memory_engine_jobs.py checks it on the kernels)."""
from __future__ import annotations

import copy
import random

import pyarrow.compute as pc
import torch
from transformers import Trainer
from trl import SFTConfig, SFTTrainer

from lanner.kernels import has_fused_loss
from lanner.kernels.packing import padded_tokens
from lanner.worker.job_process import JobFailed
from lanner.worker.training.callbacks import MetricsCallback
from lanner.worker.training.common import common_args, rows_the_template_takes, split
from lanner.worker.training.evaluation import with_before_after_evaluation
from lanner.worker.training.late_logging import LateLogging
from lanner.worker.training.options import TrainingOptions


def build_trainer(model, tokenizer, rows: list[dict], options: TrainingOptions, output_dir: str,
                  callbacks: list) -> SFTTrainer:
    train, evaluation = split(rows_the_template_takes(rows, tokenizer, callbacks), options)
    args = SFTConfig(**common_args(options, output_dir, evaluation is not None),
                     packing=options.packing, packing_strategy="bfd", padding_free=options.packing,
                     completion_only_loss=options.completion_only_loss)
    trainer = KernelLossSFTTrainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                                   processing_class=tokenizer, callbacks=callbacks,
                                   split_long_texts=options.method == "pretrain")
    metrics = next((cb for cb in callbacks if isinstance(cb, MetricsCallback)), None)
    # The rows with no label left to learn (an answer cut off whole by max_seq_len) are dropped, packed or not
    rows_in, kept = trainer.kept_rows.get("train", (len(train), len(trainer.train_dataset)))
    eval_in, eval_kept = trainer.kept_rows.get("eval", (0, 0))
    if kept == 0:
        raise JobFailed(f"No training row has any of its answer within max_seq_len ({options.max_seq_length} tokens) "
                        "once the chat template is applied: raise max_seq_len or shorten the prompts.")
    if metrics is not None and (kept < rows_in or eval_kept < eval_in):
        left_out = [f"{total - taken} of {total} {kind} rows" for kind, total, taken
                    in (("training", rows_in, kept), ("validation", eval_in, eval_kept)) if taken < total]
        metrics.events.log(f"{' and '.join(left_out)} were left out: none of their answer fits within max_seq_len "
                           f"({options.max_seq_length} tokens)", level="warning")
    if metrics is not None and trainer.split_rows.get("train"):
        texts, pieces = trainer.split_rows["train"]
        metrics.events.log(f"{texts} of {rows_in} training texts are longer than max_seq_len ({options.max_seq_length} "
                           f"tokens): split into {pieces} rows of up to {options.max_seq_length} tokens, every token "
                           "trained on")
    if metrics is not None and trainer.cut_rows.get("train"):
        metrics.events.log(f"{trainer.cut_rows['train']} of {kept} training rows reach max_seq_len "
                           f"({options.max_seq_length} tokens): what is past it is not trained on", level="warning")
    if evaluation is not None and eval_kept == 0:
        raise JobFailed(f"None of the {eval_in} validation rows has any of its answer within max_seq_len "
                        f"({options.max_seq_length} tokens) once the chat template is applied: raise max_seq_len, "
                        "shorten the prompts, or set eval_fraction to 0.")
    if options.packing and metrics is not None:
        seq_lengths = trainer.train_dataset["seq_lengths"]
        metrics.events.log(packing_report(seq_lengths, options))
        metrics.samples_per_step *= sum(map(len, seq_lengths)) / len(seq_lengths)  # a step reads rows of samples
    return with_before_after_evaluation(trainer, evaluation, train, callbacks, options.before_after_eval)


class KernelLossSFTTrainer(LateLogging, SFTTrainer):
    """SFTTrainer whose training loss is the model's own when lanner.kernels fused its head with the
    cross-entropy: TRL's SFTTrainer otherwise calls the model through a head of its own (the logits in
    PyTorch tiles, with entropy and top-1 accuracy on every step), and the kernels' never runs. The
    loss is the same (the token sum over the accumulated batch's label count); the per-step
    `entropy` and `mean_token_accuracy` metrics are not computed. Evaluation keeps TRL's path. Each
    step is logged one step late (LateLogging), so the host does not wait for the GPU between steps."""

    kept_rows: dict[str, tuple[int, int]] = {}  # dataset name -> (rows in, rows kept); replaced, never changed
    cut_rows: dict[str, int] = {}  # dataset name -> kept rows that max_length cut short; replaced, never changed
    split_rows: dict[str, tuple[int, int]] = {}  # dataset name -> (texts split, rows made of them); the same

    def __init__(self, *args, split_long_texts: bool = False, **kwargs):
        self.split_long_texts = split_long_texts  # (read while SFTTrainer's __init__ prepares the datasets)
        super().__init__(*args, **kwargs)

    def _prepare_dataset(self, dataset, processing_class, args, packing, formatting_func, dataset_name):
        """Rows are tokenised, truncated to max_length and rid of those with no label left to learn (TRL's
        preparation without packing) before they are packed: TRL's packing truncates without dropping them,
        so a row whose answer max_length cuts off whole would train on nothing. `kept_rows[dataset_name]` is
        (rows in, rows kept), `cut_rows[dataset_name]` how many of those max_length cut short (a row of exactly
        max_length tokens counts too: the tokeniser's output does not tell the two apart). With
        `split_long_texts` (continued pretraining), a text longer than max_length is split into rows of
        max_length instead, as language-model pretraining reads a corpus: `split_rows[dataset_name]`."""
        if args.max_length is None or "input_ids" in dataset.column_names:  # already prepared: TRL's way
            return super()._prepare_dataset(dataset, processing_class, args, packing, formatting_func, dataset_name)
        if self.split_long_texts:
            whole = copy.copy(args)
            whole.max_length = None  # (TRL then truncates nothing)
            prepared = super()._prepare_dataset(dataset, processing_class, whole, False, formatting_func, dataset_name)
            lengths = pc.list_value_length(prepared.with_format("arrow")["input_ids"]).to_pylist()
            long, kept, cut = sum(n > args.max_length for n in lengths), sum(n > 1 for n in lengths), 0
            prepared = _split_rows(prepared, args.max_length)
            # (every kept text that was not long is one row of the split)
            self.split_rows = {**self.split_rows, dataset_name: (long, len(prepared) - (kept - long))}
        else:
            prepared = super()._prepare_dataset(dataset, processing_class, args, False, formatting_func, dataset_name)
            lengths = pc.list_value_length(prepared.with_format("arrow")["input_ids"])  # not every id as a Python int
            kept, cut = len(prepared), pc.sum(pc.greater_equal(lengths, args.max_length)).as_py() or 0
        self.kept_rows = {**self.kept_rows, dataset_name: (len(dataset), kept)}
        self.cut_rows = {**self.cut_rows, dataset_name: cut}
        if not packing or len(prepared) == 0:
            return prepared
        return super()._prepare_dataset(prepared, processing_class, args, True, formatting_func, dataset_name)

    def logs_late(self) -> bool:
        return has_fused_loss(self.model)  # TRL's own loss reads its metrics on the host as it goes

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if (return_outputs or not self.model.training or self.label_smoother is not None
                or self.compute_loss_func is not None or not has_fused_loss(self.model)):
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        inputs["use_cache"] = False
        if getattr(self, "aux_loss_enabled", False):  # an MoE model's router loss, as TRL asks for it
            inputs["output_router_logits"] = True
        self._count_train_tokens(inputs)
        return Trainer.compute_loss(self, model, inputs, num_items_in_batch=num_items_in_batch)

    def _count_train_tokens(self, inputs) -> None:
        """TRL's `num_tokens` metric (what the job's tokens/s is computed from), as its compute_loss
        counts it: the attention mask's tokens, or a padding-free row's length; kept on the device until
        the step is logged."""
        if "attention_mask" in inputs:
            local = inputs["attention_mask"].sum()
        else:
            local = torch.tensor(inputs["position_ids"].size(1), device=inputs["position_ids"].device)
        self.count_tokens(self.accelerator.gather_for_metrics(local).sum() // getattr(self, "_tp_size", 1))

    def late_logged_metrics(self, tokens: int) -> None:
        self._total_train_tokens = tokens
        self._metrics["train"]["num_tokens"] = [tokens]


def _split_rows(dataset, length: int):
    """The dataset with each row longer than `length` tokens split into rows of `length` (the last shorter), and rows
    of one token, which have no next token to learn, dropped."""
    def pieces(batch):
        return {column: [row[start:start + length] for row, ids in zip(batch[column], batch["input_ids"])
                         for start in range(0, len(ids), length) if len(ids) - start > 1]
                for column in ("input_ids", "labels")}

    return dataset.map(pieces, batched=True, remove_columns=dataset.column_names, desc="Splitting long texts")


def packing_report(seq_lengths: list[list[int]], options: TrainingOptions) -> str:
    """What packing did to the training set, against micro-batches padded to their longest sample (in
    the shuffled order an unpacked run would read them)."""
    lengths = [n for row in seq_lengths for n in row]
    random.Random(options.seed).shuffle(lengths)
    real, padded = sum(lengths), padded_tokens(lengths, options.per_device_train_batch_size)
    return (f"Packing: {len(lengths)} samples in {len(seq_lengths)} rows of up to {options.max_seq_length} tokens, "
            f"each sample attending only to itself; {real:,} tokens an epoch where micro-batches of "
            f"{options.per_device_train_batch_size} padded to their longest sample would feed {padded:,} "
            f"({1 - real / padded:.0%} less)")
