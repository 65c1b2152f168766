"""Odds-ratio preference optimisation (ORPO) with TRL's ORPOTrainer, which TRL keeps in
trl.experimental: the SFT loss on the chosen answer plus beta (the paper's lambda) times the log odds
ratio of chosen over rejected. It needs no reference model."""
from __future__ import annotations

from trl.experimental.orpo import ORPOConfig, ORPOTrainer

from lanner.worker.training.common import common_args, rows_that_fit, split
from lanner.worker.training.options import TrainingOptions


def build_trainer(model, tokenizer, rows: list[dict], options: TrainingOptions, output_dir: str,
                  callbacks: list) -> ORPOTrainer:
    train, evaluation = split(rows_that_fit(rows, tokenizer, options, callbacks), options)
    args = ORPOConfig(**common_args(options, output_dir, evaluation is not None), beta=options.beta)
    return ORPOTrainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                       processing_class=tokenizer, callbacks=callbacks)
