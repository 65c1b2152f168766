"""A sweep: one base spec, a search over some of its fields (every combination of given values, or a
seeded random search over values and ranges), a budget of runs, and the metric that ranks them.
Each run is an ordinary training job: the base spec with the swept fields substituted, validated as
any spec. The sweep itself never runs; its status is its runs' (sweep_status)."""
from __future__ import annotations

import copy
import itertools
import math
import random
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, model_validator

from lanner.core.models import JobStatus
from lanner.core.spec import SPEC_MODEL_CONFIG, JobSpec

MAX_SWEEP_RUNS = 64
MAX_VALUES = 32
# The fields a sweep may vary, with the type a drawn value takes; each is a path into JobSpec.
SWEPT_FIELDS: dict[str, type] = {
    "hyperparameters.learning_rate": float, "hyperparameters.epochs": float, "hyperparameters.max_steps": int,
    "hyperparameters.batch_size": int, "hyperparameters.gradient_accumulation": int,
    "hyperparameters.warmup_ratio": float, "hyperparameters.weight_decay": float,
    "hyperparameters.lr_scheduler": str, "hyperparameters.seed": int,
    "lora.rank": int, "lora.alpha": float, "lora.dropout": float, "preference.beta": float,
}
SweptField = Literal[tuple(SWEPT_FIELDS)]  # type: ignore[valid-type]
ENDED = (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


class SweepParameter(BaseModel):
    """One swept field: the values to try, or (random search only) a range to draw from."""
    model_config = SPEC_MODEL_CONFIG

    field: SweptField
    values: list[int | float | Annotated[str, Field(min_length=1, max_length=64)]] | None = Field(
        default=None, min_length=1, max_length=MAX_VALUES)
    low: float | None = Field(default=None, description="Random search: the range's lower end")
    high: float | None = Field(default=None, description="Random search: the range's upper end")
    log: bool = Field(default=False, description="Draw from the range on a log scale (learning rates)")

    @model_validator(mode="after")
    def _values_or_range(self) -> "SweepParameter":
        ranged = self.low is not None or self.high is not None
        if (self.values is None) == (not ranged):
            raise ValueError(f"{self.field}: give values, or a range (low and high), not both")
        repeated = [value for index, value in enumerate(self.values or []) if value in self.values[:index]]
        if repeated:  # each would queue the same run again
            raise ValueError(f"{self.field}: {repeated[0]!r} is given twice: give each value once")
        if ranged:
            if self.low is None or self.high is None or not self.low < self.high:
                raise ValueError(f"{self.field}: a range needs low below high")
            if SWEPT_FIELDS[self.field] is str:
                raise ValueError(f"{self.field} takes names: give values")
            if self.log and self.low <= 0:
                raise ValueError(f"{self.field}: a log-scale range needs low above 0")
            if not math.isfinite(self.high - self.low):  # a draw from it would be infinite
                raise ValueError(f"{self.field}: the range from {self.low:g} to {self.high:g} is wider than a "
                                 "number holds: narrow it")
        return self


class SweepSpec(BaseModel):
    model_config = SPEC_MODEL_CONFIG

    base: JobSpec = Field(description="The spec every run starts from (POST /api/jobs's body)")
    name: str | None = Field(default=None, max_length=200)
    strategy: Literal["grid", "random"] = Field(
        default="grid", description="grid: every combination of the values; random: `budget` draws, seeded")
    parameters: list[SweepParameter] = Field(min_length=1, max_length=8)
    budget: int = Field(default=8, ge=1, le=MAX_SWEEP_RUNS, description="The most runs the sweep queues")
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="Random search: the same seed draws the same runs")
    metric: str = Field(default="eval_loss", pattern=r"^[A-Za-z_][\w/.\-]{0,63}$",
                        description="The logged value that ranks the runs (its last value)")
    direction: Literal["minimize", "maximize"] = "minimize"

    @model_validator(mode="after")
    def _fits_budget(self) -> "SweepSpec":
        fields = [parameter.field for parameter in self.parameters]
        if repeated := sorted({field for field in fields if fields.count(field) > 1}):
            raise ValueError(f"{repeated[0]} is swept twice: give it once, with all its values")
        ranged = [parameter.field for parameter in self.parameters if parameter.values is None]
        if self.strategy == "grid" and ranged:
            raise ValueError(f"a grid takes values ({', '.join(ranged)} has a range): give values, or use random search")
        if not ranged and (size := grid_size(self)) < self.budget and self.strategy == "random":
            raise ValueError(f"the values make {size} distinct runs, fewer than the budget of {self.budget}: "
                             f"lower the budget to {size}, or use a grid")
        if self.strategy == "grid" and (size := grid_size(self)) > self.budget:
            raise ValueError(f"the grid has {size} runs, over the budget of {self.budget}: raise the budget or "
                             "give fewer values")
        if self.metric == "eval_loss" and not self.base.hyperparameters.eval_fraction:
            raise ValueError("eval_loss is measured on held-out rows: set hyperparameters.eval_fraction in the base "
                             "spec (e.g. 0.1), or rank by loss")
        return self


def grid_size(sweep: SweepSpec) -> int:
    return math.prod(len(parameter.values or ()) for parameter in sweep.parameters)


def _draw(parameter: SweepParameter, rng: random.Random) -> Any:
    if parameter.values is not None:
        return rng.choice(parameter.values)
    if parameter.log:
        value = math.exp(rng.uniform(math.log(parameter.low), math.log(parameter.high)))
    else:
        value = rng.uniform(parameter.low, parameter.high)
    return round(value) if SWEPT_FIELDS[parameter.field] is int else float(f"{value:.4g}")


def assignments(sweep: SweepSpec) -> list[dict[str, Any]]:
    """Each run's values of the swept fields: the grid in the order given, or the random draws of
    the sweep's seed (distinct combinations when every field has values)."""
    fields = [parameter.field for parameter in sweep.parameters]
    if sweep.strategy == "grid":
        return [dict(zip(fields, combination)) for combination in
                itertools.product(*(parameter.values for parameter in sweep.parameters))]
    rng = random.Random(sweep.seed)
    if all(parameter.values is not None for parameter in sweep.parameters):
        # the grid's places, not the grid: 8 fields of 32 values make 32**8 combinations, which a list
        # of them would not fit in memory; random.sample picks the same places from either
        return [dict(zip(fields, _combination(sweep.parameters, place)))
                for place in rng.sample(range(grid_size(sweep)), sweep.budget)]
    return [{parameter.field: _draw(parameter, rng) for parameter in sweep.parameters} for _ in range(sweep.budget)]


def _combination(parameters: list[SweepParameter], place: int) -> list[Any]:
    """The grid's combination at `place`, in itertools.product's order (the last field varies fastest)."""
    values = []
    for parameter in reversed(parameters):
        place, index = divmod(place, len(parameter.values))
        values.append(parameter.values[index])
    return values[::-1]


def _substituted(base: dict[str, Any], assignment: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(base)
    for path, value in assignment.items():
        section, name = path.split(".")
        data[section] = {**(data.get(section) or {}), name: value}
    return data


@dataclass
class Run:
    assignment: dict[str, Any]
    spec: JobSpec


def runs(sweep: SweepSpec) -> tuple[list[Run], list[dict[str, Any]]]:
    """Each run's spec, validated as POST /api/jobs validates one; or the errors of every run that
    would be invalid, located on the parameter that made it so (["parameters", i, "values"]) or
    else on the base spec (["base", ...]), each once."""
    base = sweep.base.model_dump(mode="json", exclude={"name"})
    made, errors = [], []
    for assignment in assignments(sweep):
        try:
            made.append(Run(assignment, JobSpec.model_validate(_substituted(base, assignment))))
        except ValidationError as invalid:
            for error in invalid.errors(include_url=False):
                error = _located(sweep, assignment, error)
                if error not in errors:
                    errors.append(error)
    return made, errors


def _located(sweep: SweepSpec, assignment: dict[str, Any], error: dict[str, Any]) -> dict[str, Any]:
    loc = tuple(str(part) for part in error["loc"])
    for index, parameter in enumerate(sweep.parameters):
        path = tuple(parameter.field.split("."))
        if path[:len(loc)] == loc or loc[:len(path)] == path:
            return {"loc": ["parameters", index, "values"], "type": error["type"],
                    "msg": f"{parameter.field} = {assignment[parameter.field]!r}: {error['msg']}"}
    return {"loc": ["base", *error["loc"]], "type": error["type"], "msg": error["msg"]}


def run_name(sweep_name: str, index: int, assignment: dict[str, Any]) -> str:
    values = ", ".join(f"{path.rsplit('.', 1)[1]}={value:g}" if isinstance(value, float) else
                       f"{path.rsplit('.', 1)[1]}={value}" for path, value in assignment.items())
    return f"{sweep_name} #{index} ({values})"


def sweep_status(statuses: list[JobStatus], cancelled: bool) -> JobStatus:
    """A sweep is queued while all its runs are, running while any is running or still to run after
    one has ended; once all have ended: cancelled if it was cancelled, succeeded if any run succeeded,
    failed otherwise."""
    if statuses and all(status == JobStatus.queued for status in statuses):
        return JobStatus.queued
    if any(status not in ENDED for status in statuses):
        return JobStatus.running
    if cancelled:
        return JobStatus.cancelled
    return JobStatus.succeeded if JobStatus.succeeded in statuses else JobStatus.failed


@dataclass
class Ranked:
    job_id: int
    value: float | None
    rank: int | None
    best: bool


def ranking(values: list[tuple[int, JobStatus, float | None]], direction: str) -> list[Ranked]:
    """The runs (job id, status, the metric's last value) best first; the runs without a value after,
    by id. The best is the first succeeded run with a value (a running one may still change)."""
    measured = sorted((run for run in values if run[2] is not None),
                      key=lambda run: (run[2] if direction == "minimize" else -run[2], run[0]))
    unmeasured = sorted((run for run in values if run[2] is None), key=lambda run: run[0])
    best = next((job_id for job_id, status, _ in measured if status == JobStatus.succeeded), None)
    return ([Ranked(job_id, value, rank, job_id == best) for rank, (job_id, _, value) in enumerate(measured, 1)]
            + [Ranked(job_id, None, None, False) for job_id, _, _ in unmeasured])
