"""A sweep's runs as data: the grid in order, a seeded random search drawn again the same, ranges
kept and integers rounded; the sweep's status from its runs'; the ranking's best."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from lanner.core.models import JobStatus
from lanner.core.sweep import SweepSpec, assignments, ranking, sweep_status

BASE = {"method": "lora", "model": "builtin/SmolLM2-135M-Instruct", "dataset_id": 1}
RANGES = [{"field": "hyperparameters.learning_rate", "low": 1e-5, "high": 1e-2, "log": True},
          {"field": "lora.rank", "low": 4, "high": 64}, {"field": "lora.alpha", "values": [8, 16]}]


def spec(parameters, **fields) -> SweepSpec:
    return SweepSpec(base=BASE, parameters=parameters, metric="loss", **fields)


def test_a_seeded_random_search_draws_the_same_runs_again_within_its_ranges():
    runs = assignments(spec(RANGES, strategy="random", budget=6, seed=11))
    assert runs == assignments(spec(RANGES, strategy="random", budget=6, seed=11))
    assert runs != assignments(spec(RANGES, strategy="random", budget=6, seed=12))
    assert all(1e-5 <= run["hyperparameters.learning_rate"] <= 1e-2 and isinstance(run["lora.rank"], int)
               and 4 <= run["lora.rank"] <= 64 and run["lora.alpha"] in (8, 16) for run in runs)
    # values only: distinct combinations, as many as the budget
    picked = assignments(spec([{"field": "lora.rank", "values": [4, 8, 16]}, {"field": "lora.alpha", "values": [8, 16]}],
                              strategy="random", budget=5, seed=1))
    assert len({tuple(run.values()) for run in picked}) == 5
    with pytest.raises(ValidationError, match="fewer than the budget"):
        spec([{"field": "lora.rank", "values": [4, 8]}], strategy="random", budget=3)
    with pytest.raises(ValidationError, match="lora.rank is swept twice"):
        spec([{"field": "lora.rank", "values": [4]}, {"field": "lora.rank", "values": [8]}])
    with pytest.raises(ValidationError, match="at most 64 characters"):
        spec([{"field": "hyperparameters.lr_scheduler", "values": ["x" * 65]}])
    with pytest.raises(ValidationError, match="log-scale range needs low above 0"):
        spec([{"field": "hyperparameters.weight_decay", "low": 0, "high": 0.1, "log": True}], strategy="random")
    # a value given twice queued the same run twice, random search included
    with pytest.raises(ValidationError, match="2 is given twice"):
        spec([{"field": "lora.rank", "values": [4, 2, 2]}], strategy="random", budget=2)
    with pytest.raises(ValidationError, match="1.0 is given twice"):
        spec([{"field": "hyperparameters.epochs", "values": [1, 1.0]}])


def test_the_grid_is_every_combination_in_the_order_given():
    runs = assignments(spec([{"field": "hyperparameters.lr_scheduler", "values": ["linear", "cosine"]},
                             {"field": "hyperparameters.epochs", "values": [1, 2]}], budget=4))
    assert [tuple(run.values()) for run in runs] == [("linear", 1), ("linear", 2), ("cosine", 1), ("cosine", 2)]


@pytest.mark.parametrize("statuses, cancelled, expected", [
    (["queued", "queued"], False, "queued"),
    (["succeeded", "queued"], False, "running"),
    (["failed", "running"], True, "running"),
    (["succeeded", "failed"], False, "succeeded"),
    (["failed", "cancelled"], False, "failed"),
    (["succeeded", "cancelled"], True, "cancelled"),
])
def test_a_sweeps_status_is_its_runs(statuses, cancelled, expected):
    assert sweep_status([JobStatus(status) for status in statuses], cancelled) == JobStatus(expected)


def test_the_best_run_is_the_best_succeeded_one():
    ranked = ranking([(1, JobStatus.failed, 0.1), (2, JobStatus.succeeded, 0.7), (3, JobStatus.succeeded, 0.9),
                      (4, JobStatus.queued, None)], "maximize")
    assert [(run.job_id, run.rank, run.best) for run in ranked] == [(3, 1, True), (2, 2, False), (1, 3, False),
                                                                    (4, None, False)]
