"""The before/after evaluation of a real LoRA SFT of SmolLM2 (run by the studio fixture), served by
GET /api/jobs/{id}/evaluation."""
from __future__ import annotations

import json

import httpx
import pytest

from lanner.core.models import Artifact, JobStatus
from lanner.worker.training.evaluation import rouge_l

pytestmark = pytest.mark.timeout(300)
CONTRACT = {"status", "error", "prompts_from", "base_eval_loss", "tuned_eval_loss", "samples", "scores"}
SAMPLE_KEYS = {"prompt", "reference", "base_answer", "tuned_answer", "base_overlap", "tuned_overlap"}


def evaluation(served, job_id: int) -> httpx.Response:
    return httpx.get(f"{served.url}/api/jobs/{job_id}/evaluation", headers=served.headers)


def test_rouge_l_scores_word_overlap():
    assert rouge_l("The cat sat", "the cat sat on the mat") == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert rouge_l("3 plus 3 is 6.", "3 plus 3 is 6.") == 1.0
    assert rouge_l("nothing alike", "3 plus 3 is 6.") == 0.0
    assert rouge_l("", "x") == 0.0


def test_an_sft_job_ends_with_its_before_after_evaluation(served):
    studio = served.studio
    response = evaluation(served, studio.trained_job)
    assert response.status_code == 200, response.text
    result = response.json()
    assert set(result) == CONTRACT and result["status"] == "done" and result["error"] is None
    assert result["prompts_from"] == "validation"
    # 24 rows, 15% validation: the first 4 held-out prompts, each answered by both models
    samples = result["samples"]
    assert len(samples) == 4 and all(set(sample) == SAMPLE_KEYS for sample in samples)
    answers = {row["instruction"]: row["output"] for row in studio.rows}
    for sample in samples:
        assert sample["reference"] == answers[sample["prompt"]]
        assert sample["base_answer"] and sample["tuned_answer"]
        assert sample["base_overlap"] == pytest.approx(rouge_l(sample["base_answer"], sample["reference"]), abs=1e-4)
        assert sample["tuned_overlap"] == pytest.approx(rouge_l(sample["tuned_answer"], sample["reference"]), abs=1e-4)
    for side in ("base_overlap", "tuned_overlap"):
        assert result["scores"][side] == pytest.approx(sum(s[side] for s in samples) / len(samples), abs=1e-3)
    # The fine-tune learnt the rows' pattern: held-out loss down, answers closer to the references.
    assert 0 < result["tuned_eval_loss"] < result["base_eval_loss"]
    assert result["scores"]["tuned_overlap"] > result["scores"]["base_overlap"]

    with studio.sessions() as session:
        (artifact,) = session.query(Artifact).filter_by(job_id=studio.trained_job, kind="evaluation").all()
    stored = json.loads((studio.data_dir / artifact.path).read_text())
    assert artifact.size_bytes == (studio.data_dir / artifact.path).stat().st_size
    assert stored["prompts_from"] == "validation" and stored["samples"] == samples


def test_no_evaluation_when_the_job_turned_it_off_and_a_cut_short_one_reads_failed(served, tmp_path):
    studio = served.studio
    missing = evaluation(served, studio.no_eval_job)
    assert missing.status_code == 404 and "no before/after evaluation" in missing.json()["detail"]
    assert evaluation(served, 999_999).status_code == 404
    assert httpx.get(f"{served.url}/api/jobs/{studio.trained_job}/evaluation").status_code == 401

    # A job whose process died in the middle of its evaluation left "running" behind.
    job = studio.add_job(status=JobStatus.failed)
    folder = studio.data_dir / "artifacts" / str(job)
    folder.mkdir(parents=True)
    (folder / "evaluation.json").write_text(json.dumps({"status": "running", "error": None, "samples": []}))
    with studio.sessions() as session:
        session.add(Artifact(job_id=job, kind="evaluation", name="evaluation.json",
                             path=f"artifacts/{job}/evaluation.json"))
        session.commit()
    cut = evaluation(served, job).json()
    assert cut["status"] == "failed" and "before its evaluation finished" in cut["error"]
    assert cut["samples"] == [] and cut["scores"] == {"base_overlap": 0.0, "tuned_overlap": 0.0}


def test_without_a_validation_split_the_last_rows_are_held_out_of_training_for_the_evaluation(served):
    studio = served.studio
    result = evaluation(served, studio.held_out_job).json()
    assert result["status"] == "done" and result["prompts_from"] == "held_out"
    # the last 5 of the 24 rows, in order, with their own answers as references
    assert [(s["prompt"], s["reference"]) for s in result["samples"]] == \
        [(row["instruction"], row["output"]) for row in studio.rows[-5:]]
    assert result["base_eval_loss"] > 0 and result["tuned_eval_loss"] > 0  # a loss on rows it did not train on


def test_the_held_out_rows_are_taken_out_of_the_trainers_training_set(served, tmp_path):
    from redis import Redis

    from lanner.core.dataset_formats import examine
    from lanner.core.settings import get_settings
    from lanner.worker.events import JobEvents
    from lanner.worker.training.callbacks import MetricsCallback
    from lanner.worker.training.evaluation import BeforeAfterEvaluation
    from lanner.worker.training.model import load_model, load_tokenizer, resolve_model
    from lanner.core.spec import load_spec
    from lanner.worker.training.options import training_options
    from lanner.worker.training.sft import build_trainer
    from playground_helpers import PLAYGROUND_REDIS_URL

    studio = served.studio
    with studio.sessions() as session:
        from lanner.core.models import Job

        options = training_options(load_spec(session.get(Job, studio.held_out_job).config))
    _, rows = examine(studio.data_dir / "datasets" / "qa.jsonl")
    path = resolve_model("builtin/SmolLM2-135M-Instruct", get_settings())
    events = JobEvents(studio.held_out_job, Redis.from_url(PLAYGROUND_REDIS_URL, decode_responses=True),
                       lambda: studio.sessions())
    tokenizer = load_tokenizer(path, options)
    trainer = build_trainer(load_model(path, options, events), tokenizer, rows, options, str(tmp_path),
                            [MetricsCallback(events, 2)])
    (callback,) = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, BeforeAfterEvaluation)]
    assert callback.prompts_from == "held_out" and len(trainer.train_dataset) == len(rows) - 5
    trained = {tokenizer.decode(example["input_ids"]) for example in trainer.train_dataset}
    held_out = [tokenizer.decode(example["input_ids"]) for example in callback.eval_dataset]
    assert len(held_out) == 5 and not trained & set(held_out)
    assert all(row["instruction"] in text for row, text in zip(studio.rows[-5:], held_out))
