"""Reward-model training with TRL's RewardTrainer: the base with a one-number score head learns to
score each pair's chosen answer above its rejected one (the Bradley-Terry loss, -log sigmoid of the
difference). Its `accuracy` is the share of pairs scored the right way round; on the held-out pairs
(eval_fraction) it is the eval metric `eval_accuracy`. A finished reward job scores GRPO completions
(lanner.worker.training.reward_scoring)."""
from __future__ import annotations

from trl import RewardConfig, RewardTrainer

from lanner.worker.training.common import common_args, rows_that_fit, split
from lanner.worker.training.options import TrainingOptions


def build_trainer(model, tokenizer, rows: list[dict], options: TrainingOptions, output_dir: str,
                  callbacks: list) -> RewardTrainer:
    train, evaluation = split(rows_that_fit(rows, tokenizer, options, callbacks, whole=True), options)
    args = RewardConfig(**common_args(options, output_dir, evaluation is not None))
    return RewardTrainer(model=model, args=args, train_dataset=train, eval_dataset=evaluation,
                         processing_class=tokenizer, callbacks=callbacks)
