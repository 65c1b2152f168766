"""ORPO and KTO (and DPO on every weight) on the real SmolLM2 on the CPU, a few steps each."""
from __future__ import annotations

from sqlalchemy import select

from lanner.core.models import Artifact

from job_specs import merged
from training_run import events, logs, run_train_process, step_metrics, trained

PAIRS = [{"prompt": f"What is {i} plus {i}?", "chosen": f"{2 * i}.", "rejected": f"{2 * i + 1}."} for i in range(6)]
UNPAIRED = [{"prompt": f"What is {i} plus {i}?", "completion": f"{2 * i + i % 2}.", "label": i % 2 == 0}
            for i in range(8)]
SHORT = {"hyperparameters": {"max_steps": 2, "max_seq_len": 48}}


def artifact_kinds(studio, job_id: int) -> set[str]:
    with studio.sessions() as session:
        return set(session.execute(select(Artifact.kind).where(Artifact.job_id == job_id)).scalars())


def test_orpo_trains_an_adapter_on_preference_pairs(studio):
    job_id = studio.job(studio.dataset("pairs.jsonl", PAIRS), SHORT, method="orpo")
    trained(studio, job_id)
    metrics = step_metrics(studio, job_id)
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        # ORPO's loss is the SFT loss on the chosen answer plus beta times the odds-ratio term.
        assert m["nll_loss"] > 0 and m["log_odds_ratio"] < 0 and m["loss"] > m["nll_loss"]
        assert "rewards/margins" in m and m["samples_per_second"] > 0
    assert "(LoRA)" in next(line for line in logs(studio, job_id) if line.startswith("Model "))
    assert (studio.data_dir / "artifacts" / str(job_id) / "adapter" / "adapter_model.safetensors").is_file()


def test_kto_trains_on_unpaired_labelled_completions(studio):
    job_id = studio.job(studio.dataset("kto.jsonl", UNPAIRED), SHORT, method="kto")
    trained(studio, job_id)
    metrics = step_metrics(studio, job_id)
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["loss"] > 0 and "kl" in m for m in metrics)
    dataset = next(data for _, kind, data in events(studio, job_id) if kind == "dataset")
    assert (dataset["format"], dataset["usable_rows"]) == ("kto", 8)
    assert "adapter" in artifact_kinds(studio, job_id)


def test_kto_splits_preference_pairs_into_desirable_and_undesirable(studio):
    # 4 pairs -> 8 unpaired rows: two steps of micro-batch 2 x 2 accumulation go through all of them.
    job_id = studio.job(studio.dataset("pairs.jsonl", PAIRS[:4]),
                        merged(SHORT, {"hyperparameters": {"gradient_accumulation": 2}}), method="kto")
    trained(studio, job_id)
    metrics = step_metrics(studio, job_id)
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[-1]["epoch"] == 1.0
    # Both halves of the pairs trained, mixed: a step with only one kind logs only its own rewards.
    assert all("rewards/chosen" in m and "rewards/rejected" in m for m in metrics)


def test_kto_refuses_a_micro_batch_of_one_clearly(studio):
    job_id = studio.job(studio.dataset("kto.jsonl", UNPAIRED), merged(SHORT, {"hyperparameters": {"batch_size": 1}}),
                        method="kto")
    assert run_train_process(studio, job_id).returncode == 1
    assert studio.get_job(job_id).error == ("KTO needs a micro-batch (per_device_train_batch_size) of 2 or more: "
                                            "its KL term compares each completion with the others in its micro-batch.")


def test_preference_without_lora_settings_trains_every_weight(studio):
    # As the API's spec and memory estimate have it: dpo/orpo/kto with no `lora` settings tune the whole model.
    job_id = studio.job(studio.dataset("pairs.jsonl", PAIRS), {**SHORT, "lora": None}, method="dpo")
    trained(studio, job_id)
    assert [m["step"] for m in step_metrics(studio, job_id)] == [1, 2]
    assert "(every weight)" in next(line for line in logs(studio, job_id) if line.startswith("Model "))
    assert artifact_kinds(studio, job_id) >= {"model", "checkpoint"} and "adapter" not in artifact_kinds(studio, job_id)
