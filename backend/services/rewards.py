"""Trying a GRPO job's reward functions before launch: always in the reward sandbox
(lanner.core.rewards.sandbox), never in the API process."""
from __future__ import annotations

from sqlalchemy.orm import Session

from lanner.backend.schemas.rewards import RewardFailure, RewardTest, RewardTestResult, RewardTestRow
from lanner.backend.services.datasets import dataset_file, get_dataset
from lanner.core.dataset_formats import DatasetError, examine
from lanner.core.errors import UserError
from lanner.core.rewards.sandbox import RewardFunctionFailed, SandboxLimits, network_isolated, run_reward_functions
from lanner.core.settings import Settings


def _dataset_rows(session: Session, settings: Settings, dataset_id: int, count: int) -> list[dict]:
    dataset = get_dataset(session, dataset_id)
    if dataset.format != "prompt":
        raise UserError(422, f"Dataset {dataset.id} is {dataset.format}; reward functions are tried on a prompt "
                             "dataset (a prompt column and reference columns)")
    path = dataset_file(settings, dataset)
    try:
        _, rows = examine(path)
    except DatasetError as error:
        raise UserError(422, f"Dataset {dataset.id}: {error}") from None
    return [rows[index % len(rows)] for index in range(count)]


def try_rewards(session: Session, settings: Settings, test: RewardTest) -> RewardTestResult:
    if models := [function.label for function in test.reward_functions if function.kind == "reward_model"]:
        raise UserError(422, f"{', '.join(models)}: a trained reward model scores completions in the training "
                             "process, on the job's device, not here; try the other functions without it")
    count = len(test.completions)
    rows = _dataset_rows(session, settings, test.dataset_id, count) if test.dataset_id else [{"prompt": ""}] * count
    prompts = [row["prompt"] for row in rows]
    columns = {name: [row.get(name) for row in rows] for name in sorted({k for row in rows for k in row} - {"prompt"})}
    functions = [function.model_dump(mode="json", exclude_none=True) for function in test.reward_functions]
    labels = [function.label for function in test.reward_functions]
    shown = [prompt if isinstance(prompt, str) else str(prompt[-1]["content"]) for prompt in prompts]
    try:
        rewards = run_reward_functions(functions, prompts, test.completions, columns,
                                       SandboxLimits(timeout_s=test.timeout_s))
    except RewardFunctionFailed as error:
        failure = RewardFailure(function=error.function, message=error.message, traceback=error.traceback,
                                output=error.output)
        return RewardTestResult(rows=[], failure=failure, network_isolated=network_isolated())
    result = []
    for index, completion in enumerate(test.completions):
        values = {label: rewards[f][index] for f, label in enumerate(labels)}
        given = [(value, fn.weight) for value, fn in zip(values.values(), test.reward_functions) if value is not None]
        result.append(RewardTestRow(prompt=shown[index], completion=completion, rewards=values,
                                    total=sum(value * weight for value, weight in given) if given else None))
    return RewardTestResult(rows=result, network_isolated=network_isolated())
