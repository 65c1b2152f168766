"""The job spec as a job stores it: {version, spec}, read back by one function that refuses what it
cannot read in words; the options the worker once read from undeclared keys are fields, validated."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from lanner.core.errors import UserError
from lanner.core.settings import get_settings
from lanner.core.spec import SPEC_VERSION, JobSpec, load_spec, shown_config, stored_config

BASE = {"method": "lora", "model": "builtin/SmolLM2-135M-Instruct", "dataset_id": 1}


def test_a_stored_spec_reads_back_as_it_was_validated():
    spec = JobSpec.model_validate({**BASE, "preset": "quick", "requeue_on_worker_loss": True,
                                   "hyperparameters": {"memory_limit_mb": 900}})
    stored = stored_config(spec)
    assert stored["version"] == SPEC_VERSION and stored["spec"]["hyperparameters"]["learning_rate"] == 2e-4
    assert load_spec(stored) == spec and shown_config(stored) == stored["spec"]
    assert shown_config({"export": {"adapter": True}}) == {"export": {"adapter": True}}


def test_a_stored_local_model_path_is_not_checked_again_on_reading(tmp_path, monkeypatch):
    monkeypatch.setenv("LANNER_LOCAL_MODEL_DIRS", str(tmp_path.parent))
    get_settings.cache_clear()
    spec = JobSpec.model_validate({**BASE, "model": str(tmp_path)})
    stored = stored_config(spec)
    tmp_path.rmdir()  # the worker that reads it may be another machine
    assert load_spec(stored).model == str(tmp_path)
    with pytest.raises(ValidationError, match="no model folder"):
        JobSpec.model_validate(stored["spec"])


@pytest.mark.parametrize("config, words", [
    ({"version": SPEC_VERSION + 1, "spec": BASE}, f"version {SPEC_VERSION + 1}; this Lanner reads version {SPEC_VERSION}"),
    ({**BASE, "lora_r": 4}, "version None"),
    ({"version": SPEC_VERSION, "spec": {**BASE, "lora": {"rank": 0}}}, "stored spec is not valid"),
])
def test_a_spec_this_version_cannot_read_is_refused_in_words(config, words):
    with pytest.raises(UserError, match="stored spec") as refused:
        load_spec(config)
    assert words in refused.value.message


@pytest.mark.parametrize("field, value", [
    (("hyperparameters", "memory_limit_mb"), 0), (("hyperparameters", "eval_steps"), 0),
    (("hyperparameters", "max_grad_norm"), -1), (("hyperparameters", "save_steps"), None),
    (("chat_template",), ""), (("requeue_on_worker_loss",), "sometimes"),
])
def test_the_worker_options_are_validated_fields(field, value):
    data = {**BASE, field[0]: value} if len(field) == 1 else {**BASE, field[0]: {field[1]: value}}
    with pytest.raises(ValidationError) as refused:
        JobSpec.model_validate(data)
    assert [error["loc"] for error in refused.value.errors()] == [field]


def test_trackers_are_chosen_once_each_and_mlflow_only_once_an_admin_has_set_it_up(monkeypatch):
    monkeypatch.delenv("LANNER_MLFLOW_TRACKING_URI", raising=False)
    get_settings.cache_clear()
    assert JobSpec.model_validate({**BASE, "trackers": ["tensorboard", "wandb"]}).trackers == ["tensorboard", "wandb"]
    with pytest.raises(ValidationError, match="MLflow is not set up on this studio: an admin sets "
                                              "LANNER_MLFLOW_TRACKING_URI"):
        JobSpec.model_validate({**BASE, "trackers": ["mlflow"]})
    with pytest.raises(ValidationError, match="wandb is listed twice"):
        JobSpec.model_validate({**BASE, "trackers": ["wandb", "wandb"]})
    monkeypatch.setenv("LANNER_MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    get_settings.cache_clear()
    stored = stored_config(JobSpec.model_validate({**BASE, "trackers": ["mlflow"]}))
    monkeypatch.delenv("LANNER_MLFLOW_TRACKING_URI")
    get_settings.cache_clear()
    assert load_spec(stored).trackers == ["mlflow"]  # queued while it was set up: the worker says if it is gone


def test_a_spec_stored_before_trackers_existed_reads_back_without_any():
    stored = stored_config(JobSpec.model_validate(BASE))
    del stored["spec"]["trackers"]
    assert load_spec(stored).trackers == []


def test_a_reward_model_lora_on_lm_head_is_refused_at_creation():
    """A reward model's score head replaces lm_head: PEFT would drop the name beside others and fail on it alone."""
    reward = {**BASE, "method": "reward"}
    with pytest.raises(ValidationError, match="score head replaces it") as refused:
        JobSpec.model_validate({**reward, "lora": {"target_modules": ["q_proj", "lm_head"]}})
    assert [error["loc"] for error in refused.value.errors()] == [("lora",)]
    assert JobSpec.model_validate({**reward, "lora": {"target_modules": ["q_proj"]}}).lora.target_modules == ["q_proj"]
    assert JobSpec.model_validate({**BASE, "lora": {"target_modules": ["q_proj", "lm_head"]}}).lora is not None
