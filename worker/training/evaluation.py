"""Before/after evaluation at the end of an SFT job: the base model (the adapter switched off) and the
fine-tuned one answer held-out prompts, greedily and briefly; each model's eval loss on them and a
simple overlap score of each answer with the reference are stored with the job.

The result is evaluation.json in the job's artifacts folder, registered as an artifact of kind
"evaluation" (GET /api/jobs/{id}/evaluation serves it). It is written with status "running" first,
then "done" or "failed": an evaluation that fails never fails the job, whose adapter is trained.
The prompts are the first rows of the validation split when the job has one ("prompts_from":
"validation"); otherwise the last N rows of the training rows are held out of training for it
("held_out"). Only when that is impossible (too few rows, or packed sequences that mix rows) are
they the first training rows ("training"), and no eval loss is reported, since a loss on trained
rows says nothing about generalising.
On by default; the job's hyperparameter `before_after_eval: false` turns it off."""
from __future__ import annotations

import json
import logging
import os
import re
import time
from typing import Any

import torch
from transformers import TrainerCallback

from lanner.core.messages.records import EvaluationResult
from lanner.core.models import Artifact, ArtifactKind
from lanner.core.settings import get_settings
from lanner.core.storage import get_store
from lanner.worker.distributed.ranks import is_main_process
from lanner.worker.job_process import artifacts_dir
from lanner.worker.training.callbacks import CancelCallback
from lanner.worker.training.common import job_events

EVALUATION_FILE = "evaluation.json"
PROMPTS = 5               # the first N prompts of the validation split, or N rows held out of training
MIN_TRAINING_ROWS = 10    # rows left to train on below which nothing is held out
MAX_NEW_TOKENS = 48       # short answers: enough to compare, cheap on a CPU
WORD = re.compile(r"\w+", re.UNICODE)

log = logging.getLogger(__name__)


def words(text: str) -> list[str]:
    return WORD.findall(text.lower())


def rouge_l(answer: str, reference: str) -> float:
    """ROUGE-L F1 on lowercased words: the longest common subsequence against both lengths."""
    a, b = words(answer), words(reference)
    if not a or not b:
        return 0.0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    lcs = previous[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(a), lcs / len(b)
    return 2 * precision * recall / (precision + recall)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _prompt_and_reference(row: dict, tokenizer) -> tuple[str, str, str]:
    """(what the user sees as the prompt, the text the model continues, the reference answer)."""
    if "prompt" in row and "completion" in row:
        messages = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
        completion = row["completion"]
        reference = _answer_text(completion[-1]) if isinstance(completion, list) else str(completion)
        shown = "\n\n".join(f"{m['role']}: {m['content']}" if m["role"] != "user" else m["content"] for m in messages)
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                 tools=row.get("tools"))
        return shown, rendered, reference
    text_words = str(row.get("text", "")).split(" ")  # raw text: continue its first half
    half = max(1, len(text_words) // 2)
    prompt = " ".join(text_words[:half])
    return prompt, prompt, " ".join(text_words[half:])


def _answer_text(message: dict) -> str:
    """An answer's text, or for a turn that calls tools the calls as JSON (what the model should write)."""
    calls = [call["function"] for call in message.get("tool_calls", ())]
    return message["content"] or (json.dumps(calls) if calls else "")


def _final_eval_loss(state) -> float | None:
    """The eval loss the trainer logged at the last step, if it evaluated there (saves a pass)."""
    last = next((entry for entry in reversed(state.log_history) if "eval_loss" in entry), None)
    return last["eval_loss"] if last is not None and last.get("step") == state.global_step else None


class BeforeAfterEvaluation(TrainerCallback):
    """Runs when training ends (not when it was cancelled), before the adapter is saved."""

    def __init__(self, trainer, rows, prompts_from: str, events, eval_dataset=None):
        """`rows`: the raw rows whose first prompts are answered; `eval_dataset`: the same rows as the
        trainer prepared them, for each model's eval loss (None: no loss)."""
        self.trainer, self.rows, self.prompts_from, self.events = trainer, rows, prompts_from, events
        self.eval_dataset = eval_dataset
        self.settings = get_settings()
        self.path = artifacts_dir(self.settings.data_dir, events.job_id) / EVALUATION_FILE
        self.result: dict[str, Any] = {}
        self.distributed = False

    def _cancel(self) -> CancelCallback | None:
        return next((cb for cb in self.trainer.callback_handler.callbacks if isinstance(cb, CancelCallback)), None)

    def on_train_end(self, args, state, control, **kwargs):
        cancel = self._cancel()
        if cancel is not None and (cancel.stopped or cancel.requested):
            return
        # Under torchrun the eval loss is a collective step every rank would have to join: the main
        # rank alone answers the prompts (DDP holds a whole model per rank; FSDP shards it: skipped).
        self.distributed = args.world_size > 1
        if self.distributed and (not self.trainer.is_world_process_zero() or self.trainer.is_fsdp_enabled):
            return
        rows = [self.rows[i] for i in range(min(PROMPTS, len(self.rows)))]
        self.result = {"status": "running", "error": None, "base_eval_loss": None, "tuned_eval_loss": None,
                       "samples": [], "scores": {"base_overlap": 0.0, "tuned_overlap": 0.0},
                       "prompts_from": self.prompts_from,
                       "max_new_tokens": MAX_NEW_TOKENS}
        self._write(register=True)
        self.events.log(f"Before/after evaluation: the base and the fine-tuned model answer {len(rows)} "
                        f"{self.result['prompts_from']} prompts")
        started = time.monotonic()
        try:
            self._evaluate(rows, cancel, state)
            self.result["status"] = "done"
        except Exception as error:  # the job's training is done; its evaluation failing must not undo it
            log.exception("Before/after evaluation failed")
            self.result.update(status="failed", error=f"{type(error).__name__}: {error}")
        self._write()
        scores = self.result["scores"]
        self.events.publish(EvaluationResult(**{key: self.result[key] for key in
                                                ("status", "error", "base_eval_loss", "tuned_eval_loss", "scores")}))
        if self.result["status"] == "done":
            self.events.log(f"Before/after evaluation done in {time.monotonic() - started:.0f} s: overlap with the "
                            f"references {scores['base_overlap']:.3f} -> {scores['tuned_overlap']:.3f}; eval loss "
                            f"{self.result['base_eval_loss']} -> {self.result['tuned_eval_loss']}")
        else:
            self.events.log(f"Before/after evaluation failed: {self.result['error']}", level="warning")

    def _evaluate(self, rows: list[dict], cancel, state) -> None:
        trainer, model = self.trainer, self.trainer.model
        tokenizer = trainer.processing_class
        model.eval()
        if self.eval_dataset is not None and not self.distributed:
            tuned_loss = _final_eval_loss(state) if self.eval_dataset is trainer.eval_dataset else None
            if tuned_loss is None:
                tuned_loss = trainer.evaluate(self.eval_dataset, metric_key_prefix="tuned")["tuned_loss"]
            self.result["tuned_eval_loss"] = tuned_loss
            with model.disable_adapter():
                self.result["base_eval_loss"] = trainer.evaluate(self.eval_dataset, metric_key_prefix="base")["base_loss"]
        prepared = [_prompt_and_reference(row, tokenizer) for row in rows]
        tuned = self._answers(model, tokenizer, [rendered for _, rendered, _ in prepared])
        if cancel is not None and cancel.requested:
            raise RuntimeError("stopped at the cancel request")
        with model.disable_adapter():
            base = self._answers(model, tokenizer, [rendered for _, rendered, _ in prepared])
        samples = []
        for (prompt, _, reference), base_answer, tuned_answer in zip(prepared, base, tuned):
            samples.append({"prompt": prompt, "reference": reference, "base_answer": base_answer,
                            "tuned_answer": tuned_answer, "base_overlap": round(rouge_l(base_answer, reference), 4),
                            "tuned_overlap": round(rouge_l(tuned_answer, reference), 4)})
        self.result["samples"] = samples
        self.result["scores"] = {side: round(_mean([s[side] for s in samples]), 4)
                                 for side in ("base_overlap", "tuned_overlap")}

    @torch.no_grad()
    def _answers(self, model, tokenizer, prompts: list[str]) -> list[str]:
        """Greedy answers to the prompts, in one left-padded batch."""
        if not prompts:
            return []
        padding_side = tokenizer.padding_side
        tokenizer.padding_side = "left"
        try:
            batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        finally:
            tokenizer.padding_side = padding_side
        batch = batch.to(model.device)
        output = model.generate(**batch, max_new_tokens=self.result["max_new_tokens"], do_sample=False,
                                pad_token_id=tokenizer.pad_token_id, use_cache=True)
        return [text.strip() for text in tokenizer.batch_decode(output[:, batch["input_ids"].shape[1]:],
                                                                skip_special_tokens=True)]

    def _write(self, register: bool = False) -> None:
        if not is_main_process():  # every rank of a multi-GPU job evaluates (evaluate() is collective); one writes
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_name(f".{self.path.name}.partial")
        partial.write_text(json.dumps(self.result, indent=1))
        os.replace(partial, self.path)
        relative = self.path.relative_to(self.settings.data_dir).as_posix()
        get_store(self.settings, self.events.log).put(relative, self.path)
        with self.events.sessions() as session:
            artifact = session.query(Artifact).filter_by(job_id=self.events.job_id, kind=ArtifactKind.evaluation).first()
            if artifact is None and register:
                artifact = Artifact(job_id=self.events.job_id, kind=ArtifactKind.evaluation, name=EVALUATION_FILE, path=relative)
                session.add(artifact)
            if artifact is not None:
                artifact.size_bytes = self.path.stat().st_size
                session.commit()


def with_before_after_evaluation(trainer, evaluation_rows, train_rows, callbacks: list, wanted: bool):
    """Adds the before/after evaluation to an SFT trainer run by the training process (the one whose
    callbacks carry the job's events) when the job wants it; returns the trainer. Without a validation
    split, the last N training rows are taken out of the trainer's (already prepared) training set and
    evaluated on."""
    events = job_events(callbacks)
    if not wanted or events is None or not hasattr(trainer.model, "disable_adapter"):
        return trainer
    if evaluation_rows is not None:
        trainer.add_callback(BeforeAfterEvaluation(trainer, evaluation_rows, "validation", events,
                                                   trainer.eval_dataset))
        return trainer
    count, prepared = PROMPTS, trainer.train_dataset
    # Row i of the prepared set is training row i unless packing joined rows into sequences.
    if (len(train_rows) - count >= MIN_TRAINING_ROWS and len(prepared) == len(train_rows)
            and not trainer.args.packing):
        keep = len(train_rows) - count
        trainer.train_dataset = prepared.select(range(keep))
        held_out = prepared.select(range(keep, len(prepared)))
        rows = train_rows.select(range(keep, len(train_rows)))
        events.log(f"Before/after evaluation: the last {count} of {len(train_rows)} rows are held out of training "
                   "(the job has no validation split)")
        trainer.add_callback(BeforeAfterEvaluation(trainer, rows, "held_out", events, held_out))
    else:
        trainer.add_callback(BeforeAfterEvaluation(trainer, train_rows, "training", events))
    return trainer
