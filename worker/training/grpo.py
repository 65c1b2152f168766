"""Group relative policy optimisation with TRL's GRPOTrainer: for each prompt the model samples a
group of completions with its own generate on the training device, the job's reward functions score
them (in the reward sandbox, lanner.core.rewards.sandbox: user code never runs in this process), and
the policy moves toward the completions that beat their group's mean, held near the starting model
by a KL term (on a LoRA model the reference is the same network with the adapter off)."""
from __future__ import annotations

import math
import time

from trl import GRPOConfig, GRPOTrainer

from lanner.core.messages.records import CompletionSample
from lanner.core.rewards.sandbox import RewardFunctionFailed, SandboxLimits, run_reward_functions
from lanner.worker.job_process import JobFailed
from lanner.worker.training.callbacks import MetricsCallback
from lanner.worker.training.common import common_args, rows_the_template_takes, split, truncate_prompts
from lanner.worker.training.options import TrainingOptions

# Characters of a prompt or completion kept in a sampled-completions event.
SAMPLE_CHARS = 2000


def text_of(value) -> str:
    """A completion or prompt as text: a conversation's last message."""
    if isinstance(value, list):
        return str(value[-1].get("content", "")) if value else ""
    return str(value)


class JobRewards:
    """The job's reward functions, scored together once per batch: the built-ins and Python ones in one
    sandbox run, each reward model (`scorers`, by reward job id) in this process. TRL calls each
    function in turn with the same completions list; the first call scores the batch for all."""

    def __init__(self, functions: list[dict], columns: list[str], limits: SandboxLimits, scorers: dict):
        self.functions, self.columns, self.limits, self.scorers = functions, columns, limits, scorers
        self.batch, self.rewards = None, None

    def scores(self, prompts: list, completions: list, row_values: dict) -> list[list[float | None]]:
        if self.batch is not completions:
            sandboxed = [function for function in self.functions if function["kind"] != "reward_model"]
            texts = [text_of(completion) for completion in completions]
            columns = {name: row_values[name] for name in self.columns if name in row_values}
            try:
                sandbox_rewards = iter(run_reward_functions(sandboxed, prompts, texts, columns, self.limits)
                                       if sandboxed else ())
            except RewardFunctionFailed as error:
                raise JobFailed(error.details()) from None
            self.rewards = [self.scorers[function["job_id"]](prompts, completions)
                            if function["kind"] == "reward_model" else next(sandbox_rewards)
                            for function in self.functions]
            self.batch = completions
        return self.rewards

    def callables(self) -> list:
        return [_RewardColumn(self, index, function.get("name") or function["kind"])
                for index, function in enumerate(self.functions)]


class _RewardColumn:
    def __init__(self, rewards: JobRewards, index: int, name: str):
        self.rewards, self.index, self.__name__ = rewards, index, name

    def __call__(self, prompts, completions, **row_values):
        return self.rewards.scores(prompts, completions, row_values)[self.index]


class LannerGRPOTrainer(GRPOTrainer):
    """GRPOTrainer that generates on the model's own forwards (lanner.kernels.layers_unpatched), times
    generation and scoring per logged step and hands a sample of the step's completions, with their
    rewards, to `on_samples`."""

    def __init__(self, *args, on_samples, samples_logged: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.on_samples, self.samples_logged = on_samples, samples_logged
        self.seconds = {"generation_time": 0.0, "reward_time": 0.0}

    def _timed(self, key: str, call, *args):
        start = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.seconds[key] += time.perf_counter() - start

    def _generate(self, prompts):
        from lanner.kernels import layers_unpatched

        with layers_unpatched(self.model):
            return self._timed("generation_time", super()._generate, prompts)

    def _calculate_rewards(self, *args):
        return self._timed("reward_time", super()._calculate_rewards, *args)

    def log(self, logs: dict, start_time: float | None = None) -> None:
        if "loss" in logs and self.model.training:
            logs.update(self.seconds)
            self.seconds = dict.fromkeys(self.seconds, 0.0)
            if self.samples_logged:
                self.on_samples(self.state.global_step, self.samples())
        super().log(logs, start_time)

    def samples(self) -> list[CompletionSample]:
        logged = self._logs
        count = min(self.samples_logged, len(logged["completion"]))

        def number(value):
            return None if value is None or not math.isfinite(value) else float(value)

        return [CompletionSample(prompt=text_of(logged["prompt"][i])[-SAMPLE_CHARS:],
                                 completion=text_of(logged["completion"][i])[:SAMPLE_CHARS],
                                 rewards={name: number(values[i]) for name, values in logged["rewards"].items()},
                                 advantage=number(logged["advantages"][i]))
                for i in range(count)]


def reward_model_scorers(grpo, options: TrainingOptions) -> dict:
    """The trained reward models the job's reward functions name, loaded on this process's device."""
    from lanner.core.settings import get_settings
    from lanner.worker.training.model import training_dtype
    from lanner.worker.training.reward_scoring import RewardModelScorer

    return {function.job_id: RewardModelScorer(function.job_id, get_settings(), training_dtype(options),
                                               options.max_seq_length)
            for function in grpo.reward_functions if function.kind == "reward_model"}


def grpo_config(options: TrainingOptions, output_dir: str, has_eval: bool, **overrides) -> GRPOConfig:
    """The job's GRPOConfig (benchmarks/grpo_bench.py passes overrides, e.g. generation_kwargs)."""
    grpo = options.grpo
    args = common_args(options, output_dir, has_eval)
    del args["max_length"]  # GRPO bounds the completion (max_completion_length), not the row
    # An evaluation batch holds whole groups too, whatever the training micro-batch is.
    args["per_device_eval_batch_size"] = grpo.num_generations
    args.update(num_generations=grpo.num_generations, max_completion_length=grpo.max_completion_len,
                temperature=grpo.temperature, beta=grpo.beta,
                reward_weights=[function.weight for function in grpo.reward_functions],
                log_completions=False, use_vllm=False)
    return GRPOConfig(**{**args, **overrides})


def build_trainer(model, tokenizer, rows: list[dict], options: TrainingOptions, output_dir: str,
                  callbacks: list) -> GRPOTrainer:
    grpo = options.grpo
    # The prompt and its completion share max_seq_length: longer prompts keep their end.
    rows = truncate_prompts(rows_the_template_takes(rows, tokenizer, callbacks), tokenizer,
                            max(8, options.max_seq_length - grpo.max_completion_len))
    train, evaluation = split(rows, options)
    args = grpo_config(options, output_dir, evaluation is not None)
    functions = [function.model_dump(mode="json", exclude_none=True) for function in grpo.reward_functions]
    columns = sorted({key for row in rows for key in row} - {"prompt"})
    rewards = JobRewards(functions, columns, SandboxLimits(timeout_s=grpo.reward_timeout_s),
                         reward_model_scorers(grpo, options))
    metrics = next(callback for callback in callbacks if isinstance(callback, MetricsCallback))
    return LannerGRPOTrainer(model=model, reward_funcs=rewards.callables(), args=args, train_dataset=train,
                             eval_dataset=evaluation, processing_class=tokenizer, callbacks=callbacks,
                             on_samples=metrics.completions, samples_logged=grpo.samples_logged)
