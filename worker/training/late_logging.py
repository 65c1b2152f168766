"""Each step's loss, gradient norm and token count logged one step late, so that the host never waits
for the GPU between steps.

transformers' Trainer reads the loss and the gradient norm as Python floats on every logging step
(the studio logs every step, for the live chart): each read waits until the GPU has finished the step,
and everything the host does after it (callbacks, events, fetching and collating the next batch)
runs with the GPU idle. Here a logging step only queues a copy of its values to host memory behind
the step's kernels; the values are read and logged at the next step, once the host has queued that
step's work, so the GPU always has a step to run while the host does its bookkeeping. A step that
evaluates, saves or ends training is logged at once (a checkpoint's trainer state and an evaluation's
line come after the step's own values)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.trainer_pt_utils import nested_gather

# The logs' key for the number of micro-batches of a step whose loss was nan or infinite (counted as 0).
NONFINITE_KEY = "nonfinite_losses"


def to_host_behind(values: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
    """values copied to host memory behind the GPU's queued work, and the event that says the copy is
    done (None for values already on the CPU): the host reads them later without waiting now."""
    if not values.is_cuda:
        return values, None
    values = values.to("cpu", non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return values, ready


@dataclass
class PendingLog:
    step: int
    epoch: float | None
    steps_logged: int  # optimizer steps the loss sums over
    learning_rate: float
    values: torch.Tensor  # loss sum, gradient norm (nan when there is none), tokens so far, non-finite losses
    has_grad_norm: bool
    ready: torch.cuda.Event | None  # the copy to host memory, when the values live on a GPU


class LateLogging:
    """A mixin for a transformers Trainer (first in the bases) that defers its per-step logging by one
    step. A subclass counts its tokens on the device through `count_tokens` (a tensor) instead of
    reading them back; `late_logged_metrics` turns the read-back count into the trainer's metrics."""

    _pending: PendingLog | None = None
    _token_count: torch.Tensor | None = None
    _nonfinite: torch.Tensor | None = None

    def count_tokens(self, count: torch.Tensor) -> None:
        self._token_count = count if self._token_count is None else self._token_count + count

    def late_logged_metrics(self, tokens: int) -> None:
        """Set the metrics the trainer's `log` adds to a step's line, from the values read back."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._logs_late = self.logs_late()
        if not self._logs_late:
            return
        # transformers checks each micro-batch's loss for nan/inf on the host (a wait for the GPU) when
        # logging_nan_inf_filter is on; here the check stays on the device and the count is logged.
        self.args.logging_nan_inf_filter = False

    def logs_late(self) -> bool:
        """Whether this trainer's steps are logged late (a subclass whose metrics are read on the host
        as it computes them gains nothing)."""
        return True

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        if not self._logs_late:
            return loss
        finite = torch.isfinite(loss)
        self._nonfinite = (~finite).int() if self._nonfinite is None else self._nonfinite + (~finite).int()
        return torch.where(finite, loss, torch.zeros_like(loss))

    def _maybe_log_save_evaluate(self, tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval, start_time,
                                 learning_rate=None):
        if not self._logs_late:
            return super()._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                                    start_time, learning_rate=learning_rate)
        logs_now = self.control.should_log and self.state.global_step > self._globalstep_last_logged
        pending = self._queue_read_back(tr_loss, grad_norm, learning_rate) if logs_now else None
        self._log_pending()  # the step before: the GPU has finished it, or is about to
        self._pending = pending
        if self.control.should_evaluate or self.control.should_save or self.control.should_training_stop:
            self._log_pending()
        super()._maybe_log_save_evaluate(tr_loss, grad_norm, model, trial, epoch, ignore_keys_for_eval,
                                         start_time, learning_rate=learning_rate)

    def log(self, logs, start_time=None):
        if self._pending is not None:  # a line logged outside the step loop comes after the last step's
            self._log_pending()
        super().log(logs, start_time)

    def _queue_read_back(self, tr_loss, grad_norm, learning_rate) -> PendingLog:
        device = tr_loss.device
        loss = nested_gather(tr_loss, self.args.parallel_mode).mean().float()
        tr_loss -= tr_loss  # as transformers resets it on a logging step
        has_grad_norm = grad_norm is not None
        norm = (grad_norm.detach().float().reshape(()) if isinstance(grad_norm, torch.Tensor)
                else torch.tensor(float(grad_norm if has_grad_norm else "nan"), device=device))
        zero = torch.zeros((), device=device)
        tokens = zero if self._token_count is None else self._token_count.to(device=device, dtype=torch.float64)
        nonfinite = zero if self._nonfinite is None else self._nonfinite.float()
        self._nonfinite = None
        values = torch.stack([loss.double(), norm.to(device).double(), tokens.double(), nonfinite.double()])
        values, ready = to_host_behind(values)
        pending = PendingLog(step=self.state.global_step, epoch=self.state.epoch,
                             steps_logged=self.state.global_step - self._globalstep_last_logged,
                             learning_rate=learning_rate if learning_rate is not None else self._get_learning_rate(),
                             values=values, has_grad_norm=has_grad_norm, ready=ready)
        self._globalstep_last_logged = self.state.global_step
        self.store_flos()
        return pending

    def _log_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if pending.ready is not None:
            pending.ready.synchronize()
        loss_sum, norm, tokens, nonfinite = pending.values.tolist()
        self._total_loss_scalar += loss_sum
        logs = {"loss": loss_sum / pending.steps_logged}
        if pending.has_grad_norm:
            logs["grad_norm"] = norm
        logs["learning_rate"] = pending.learning_rate
        if nonfinite:
            logs[NONFINITE_KEY] = int(nonfinite)
        self.late_logged_metrics(int(tokens))
        current = self.state.global_step, self.state.epoch
        self.state.global_step, self.state.epoch = pending.step, pending.epoch
        try:
            super().log(logs)
        finally:
            self.state.global_step, self.state.epoch = current
