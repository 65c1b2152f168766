"""Trainer callbacks: every optimizer step's metrics to the job's events, checkpoints registered as
artifacts, and a cancel that stops at the next step boundary after saving a checkpoint."""
from __future__ import annotations

import time
from pathlib import Path

from transformers import TrainerCallback

from lanner.core.messages.records import CompletionSample, CompletionSamples
from lanner.worker.distributed.ranks import any_rank
from lanner.worker.events import JobEvents
from lanner.worker.training.late_logging import NONFINITE_KEY
from lanner.worker.training.router_balance import RouterBalance

# Per-step values from TRL/transformers' logs passed on as they are (besides the ones computed here).
PASSED_ON = ("loss", "learning_rate", "grad_norm", "epoch", "mean_token_accuracy", "entropy", "num_tokens",
             "nll_loss", "log_odds_ratio", "kl",  # ORPO's SFT and odds-ratio terms; KTO's and GRPO's KL estimate
             # GRPO's
             "reward", "reward_std", "frac_reward_zero_std", "completions/mean_length", "completions/min_length",
             "completions/max_length", "completions/clipped_ratio", "generation_time", "reward_time")
PASSED_ON_PREFIXES = ("rewards/",)  # DPO/ORPO/KTO's rewards/chosen, ...; GRPO's per reward function


class MetricsCallback(TrainerCallback):
    def __init__(self, events: JobEvents, samples_per_step: int, on_checkpoint=None, trackers=None,
                 router_balance: RouterBalance | None = None):
        self.events = events
        self.trackers = trackers  # the job's experiment trackers (JobTrackers), when it chose any
        self.router_balance = router_balance  # an MoE model's: each step's router load balance
        self.samples_per_step = samples_per_step
        self.on_checkpoint = on_checkpoint
        self.last_step_logged_at = None  # when the previous step's line came, or training (re)started
        self.tokens_seen = None
        self.last_step_published = -1

    def on_train_begin(self, args, state, control, **kwargs):
        self.events.total_steps(state.max_steps)
        self.events.log(f"Training for {state.max_steps} steps")
        self.last_step_logged_at = time.perf_counter()

    # A step's time is the time between two steps' lines: a trainer that logs each step once the GPU has
    # finished it (lanner.worker.training.late_logging) gives the GPU's pace. Evaluations and checkpoints
    # between two steps are not counted.
    def on_evaluate(self, args, state, control, **kwargs):
        self.last_step_logged_at = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        name = f"checkpoint-{state.global_step}"
        if self.on_checkpoint:
            self.on_checkpoint(Path(args.output_dir) / name, state.global_step)
        self.last_step_logged_at = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self.router_balance is not None:
            self.router_balance.end_step(state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        step = state.global_step
        if "eval_loss" in logs:
            self.publish(step, {key: value for key, value in logs.items() if key.startswith("eval_")})
            return
        if "loss" not in logs or step == self.last_step_published:
            return  # the end-of-training summary, or a repeat
        self.last_step_published = step
        now = time.perf_counter()
        step_time = now - self.last_step_logged_at if self.last_step_logged_at is not None else None
        self.last_step_logged_at = now
        if logs.get(NONFINITE_KEY):
            self.events.log(f"Step {step}: the loss was not finite (NaN or infinite) in {logs[NONFINITE_KEY]} "
                            "micro-batch(es), counted as 0 in the step's loss; a lower learning rate or "
                            "max_grad_norm usually helps", level="warning")
        values = {key: value for key, value in logs.items()
                  if (key in PASSED_ON or key.startswith(PASSED_ON_PREFIXES)) and value is not None}
        if self.router_balance is not None:
            values.update(self.router_balance.step_values(step))
        if step_time:
            values["step_time"] = step_time
            if "generation_time" in values:  # GRPO: the step's time split
                values["training_time"] = max(0.0, step_time - values["generation_time"]
                                              - values.get("reward_time", 0.0))
            values["samples_per_second"] = self.samples_per_step / step_time
            if "num_tokens" in logs:
                if self.tokens_seen is None and step == 1:
                    self.tokens_seen = 0
                if self.tokens_seen is not None:
                    values["tokens_per_second"] = (logs["num_tokens"] - self.tokens_seen) / step_time
                self.tokens_seen = logs["num_tokens"]
        values["total_steps"] = state.max_steps
        self.publish(step, values, total_steps=state.max_steps)

    def publish(self, step: int, values: dict, total_steps: int | None = None) -> None:
        self.events.metric(step, values, total_steps=total_steps)
        if self.trackers is not None:
            self.trackers.log_metrics(step, values)

    def completions(self, step: int, samples: list[CompletionSample]) -> None:
        self.events.publish(CompletionSamples(step=step, samples=samples))


class CancelCallback(TrainerCallback):
    """Set `requested` (from a SIGTERM handler) and training saves a checkpoint at the end of the
    current step and stops."""

    def __init__(self):
        self.requested = False
        self.stopped = False

    def on_step_end(self, args, state, control, **kwargs):
        if any_rank(self.requested):  # every rank of a multi-GPU job stops at the same step
            control.should_save = True
            control.should_training_stop = True
            self.stopped = True
