"""Supervised fine-tuning (lora, qlora, full) and continued pretraining on raw text (pretrain) with
TRL's SFTTrainer, on whatever model.py built (an adapter, or every weight): prompt/completion rows
through the model's chat template with the loss on the completions, or text rows for plain language
modelling."""
from __future__ import annotations

from trl import SFTConfig, SFTTrainer

from lanner.worker.training.common import common_args, split
from lanner.worker.training.evaluation import with_before_after_evaluation
from lanner.worker.training.options import TrainingOptions


def build_trainer(model, tokenizer, rows: list[dict], options: TrainingOptions, output_dir: str,
                  callbacks: list) -> SFTTrainer:
    train, evaluation = split(rows, options)
    args = SFTConfig(**common_args(options, output_dir, evaluation is not None),
                     packing=options.packing, completion_only_loss=options.completion_only_loss)
    trainer = SFTTrainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                         processing_class=tokenizer, callbacks=callbacks)
    return with_before_after_evaluation(trainer, evaluation, train, callbacks)
