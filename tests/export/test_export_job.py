"""An export job in the queue: a worker claims it like a training job and runs lanner.worker.export in
a subprocess, which records each file as an artifact with its verification and streams progress; the
API then lists the files with their sizes and verification and serves them in byte ranges."""
from __future__ import annotations

import shutil

from export_helpers import EXPORT_REDIS_URL, new_user, signed_in_client
from redis import Redis

from lanner.core import db
from lanner.core.models import Artifact, Job, JobKind, JobStatus
from lanner.core.queue.claim import claim_next_job
from lanner.core.settings import Settings, get_settings
from lanner.core.streams import job_stream, read_after
from lanner.worker.devices import cpu_device
from lanner.worker.runner import run_job


def trained_job(settings: Settings, adapter) -> tuple[int, int]:
    """A finished training job whose adapter artifact is the given one; returns (owner, job id)."""
    target = settings.data_dir / "artifacts" / "1" / "adapter"
    shutil.copytree(adapter, target)
    owner = new_user(settings)
    with db.session_factory(settings.database_url)() as session:
        job = Job(owner_id=owner, name="trained", method="lora", model="builtin/SmolLM2-135M-Instruct",
                  status=JobStatus.succeeded, config={})
        session.add(job)
        session.flush()
        session.add(Artifact(job_id=job.id, kind="adapter", name="adapter", path="artifacts/1/adapter", size_bytes=1))
        session.commit()
        return owner, job.id


def running_export_job(settings: Settings, owner: int, parent: int, export: dict) -> int:
    """An export job of `parent` as the worker has just claimed it (running), for the export process
    to be run on directly; returns its id."""
    with db.session_factory(settings.database_url)() as session:
        job = Job(owner_id=owner, kind=JobKind.export, name="export", method="export", model="builtin/SmolLM2-135M-Instruct",
                  parent_job_id=parent, status=JobStatus.running, config={"export": export})
        session.add(job)
        session.commit()
        return job.id


def test_an_export_job_runs_on_a_worker_and_records_verified_artifacts(settings, trained_adapter):
    owner, parent = trained_job(settings, trained_adapter)
    sessions = db.session_factory(settings.database_url)
    with sessions() as session:
        session.add(Job(owner_id=owner, kind=JobKind.export, name="export", method="export",
                        model="builtin/SmolLM2-135M-Instruct", parent_job_id=parent, status=JobStatus.queued,
                        config={"export": {"adapter": True, "merged": False, "gguf_types": ["q8_0"]}}))
        session.commit()
    with sessions() as session:
        job = claim_next_job(session, "cpu0@test", cpu_device())
    assert job is not None and job.kind == JobKind.export
    redis = Redis.from_url(EXPORT_REDIS_URL, decode_responses=True)

    assert run_job(settings, sessions, redis, job, "cpu0@test", cpu_device()) == JobStatus.succeeded

    with sessions() as session:
        artifacts = {a.kind: a for a in session.query(Artifact).filter_by(job_id=job.id)}
        assert session.get(Job, job.id).status == JobStatus.succeeded
    assert {"adapter", "gguf", "modelfile"} <= set(artifacts)
    gguf = artifacts["gguf"]
    assert gguf.name.endswith("-q8_0.gguf") and gguf.verification["passed"] is True
    assert (settings.data_dir / gguf.path).stat().st_size == gguf.size_bytes > 50 * 2**20
    events = read_after(redis, job_stream(job.id))
    stages = [data["stage"] for _, kind, data in events if kind == "progress"]
    assert stages[0] == "check" and stages[-1] == "done"
    assert any(kind == "verification" for _, kind, _ in events)

    # What the studio shows and serves: the files with sizes and verification, downloads in ranges.
    client = signed_in_client(settings, owner)
    listed = {a["kind"]: a for a in client.get(f"/api/jobs/{job.id}/artifacts").json()}
    assert listed["gguf"]["size_bytes"] == gguf.size_bytes
    assert listed["gguf"]["verification"]["passed"] is True and listed["gguf"]["verification"]["kl_bound"]
    assert "adapter_model.safetensors" in listed["adapter"]["files"]
    part = client.get(f"/api/artifacts/{gguf.id}/download", headers={"Range": "bytes=0-3"})
    assert part.status_code == 206 and part.content == b"GGUF"
    assert part.headers["content-range"] == f"bytes 0-3/{gguf.size_bytes}"


def test_exporting_a_job_without_an_adapter_fails_clearly(settings, trained_adapter):
    owner, parent = trained_job(settings, trained_adapter)
    sessions = db.session_factory(settings.database_url)
    with sessions() as session:
        session.query(Artifact).filter_by(job_id=parent).delete()
        session.add(Job(owner_id=owner, kind=JobKind.export, name="export", method="export",
                        model="builtin/SmolLM2-135M-Instruct", parent_job_id=parent, status=JobStatus.queued,
                        config={"export": {}}))
        session.commit()
    with sessions() as session:
        job = claim_next_job(session, "cpu0@test", cpu_device())
    redis = Redis.from_url(EXPORT_REDIS_URL, decode_responses=True)
    assert run_job(settings, sessions, redis, job, "cpu0@test", cpu_device()) == JobStatus.failed
    with sessions() as session:
        assert session.get(Job, job.id).error == f"Job {parent} saved neither an adapter nor a model; nothing to export."


def test_a_qlora_adapter_is_merged_into_the_4bit_base_its_training_recorded(tmp_path):
    import json

    from lanner.worker.export_process import base_quantization
    from lanner.worker.train_process import TRAINING_RECORD

    # Adapters saved before training recorded its settings: the job's config, else Lanner's defaults.
    assert base_quantization(Job(method="lora", config={}), tmp_path) is None
    assert base_quantization(Job(method="qlora", config={}), tmp_path) == {}
    custom = {"double_quant": False, "dtype": "bfloat16"}
    assert base_quantization(Job(method="qlora", config={"quantization": custom}), tmp_path) == custom
    # What training recorded beside the adapter wins; an adapter over a 16-bit base recorded none.
    recorded = {"quant_type": "nf4", "blocksize": 64, "double_quant": True, "dtype": "float32"}
    (tmp_path / TRAINING_RECORD).write_text(json.dumps({"method": "qlora", "quantization": recorded}))
    assert base_quantization(Job(method="qlora", config={"quantization": custom}), tmp_path) == recorded
    (tmp_path / TRAINING_RECORD).write_text(json.dumps({"method": "lora"}))
    assert base_quantization(Job(method="lora", config={}), tmp_path) is None


def test_the_gguf_types_and_export_defaults_have_one_definition():
    import llama_cpp

    from lanner.backend.app import create_app
    from lanner.core.export_spec import GGUF_TYPES, QUANTIZER_TYPES, ExportSpec
    from lanner.worker.export import QUANT_TYPES, ExportRequest

    defaults = ExportSpec()
    body = create_app().openapi()["components"]["schemas"]["ExportCreate"]["properties"]
    assert body["gguf_types"]["items"]["enum"] == list(GGUF_TYPES)
    assert body["gguf_types"]["default"] == defaults.gguf_types and body["merged_dtype"]["default"] == defaults.merged_dtype
    request = ExportRequest(base_model_dir=None, adapter_dir=None, out_dir=None)
    assert (request.adapter, request.merged, request.merged_dtype, list(request.gguf_types), request.verify) == \
        (defaults.adapter, defaults.merged, defaults.merged_dtype, defaults.gguf_types, defaults.verify)
    assert set(QUANT_TYPES) < set(GGUF_TYPES) and set(QUANTIZER_TYPES) < set(QUANT_TYPES)
    assert body["gguf_types"]["x-llama-cpp-types"] == list(QUANTIZER_TYPES)  # the web UI's k-quant boxes
    assert all(hasattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{qtype.upper()}") for qtype in QUANT_TYPES)


def test_an_export_job_keeps_what_passed_and_its_final_status_names_what_failed(settings, trained_adapter,
                                                                               monkeypatch):
    import json

    from lanner.worker import runner
    from lanner.worker.export import pipeline
    from lanner.worker.export_process import ExportProcess
    from lanner.worker.job_process import EXIT_PARTIAL

    monkeypatch.setattr(pipeline, "Q8_0_KL_BOUND", 0.0)  # no q8_0 file is that close: its check fails
    get_settings.cache_clear()  # the process reads this test's environment
    owner, parent = trained_job(settings, trained_adapter)
    sessions = db.session_factory(settings.database_url)
    job_id = running_export_job(settings, owner, parent, {"adapter": True, "merged": False, "gguf_types": ["f16", "q8_0"]})

    assert ExportProcess(job_id).run() == EXIT_PARTIAL  # the process the worker starts, run here

    status, error = runner._outcome(sessions, job_id, EXIT_PARTIAL, False, settings.data_dir / "no.log")
    assert status == JobStatus.succeeded
    assert error.startswith("Exported with 1 format left out (gguf-q8_0)") and "mean KL (nats per position)" in error, error
    with sessions() as session:
        kept = sorted((a.kind, a.name) for a in session.query(Artifact).filter_by(job_id=job_id))
    assert [kind for kind, _ in kept] == ["adapter", "gguf", "modelfile", "modelfile"]
    assert [name for kind, name in kept if kind == "gguf"][0].endswith("-f16.gguf")
    export_dir = settings.data_dir / "artifacts" / str(job_id) / "export"
    assert not list((export_dir / "gguf").glob("*q8_0*"))
    manifest = json.loads((export_dir / "export.json").read_text())
    assert {name: f["status"] for name, f in manifest["formats"].items()} == {
        "adapter": "unchecked", "gguf-f16": "verified", "gguf-q8_0": "failed"}

    events = read_after(Redis.from_url(EXPORT_REDIS_URL, decode_responses=True), job_stream(job_id))
    verification = next(data for _, kind, data in events if kind == "verification")
    assert verification["formats"]["gguf-q8_0"]["status"] == "failed"
    assert [(f["figure"], f["bound"], f["passed"]) for f in verification["formats"]["gguf-q8_0"]["figures"]
            if not f["passed"]] == [("mean KL (nats per position)", 0.0, False)]
    assert "larger GGUF type" in verification["formats"]["gguf-q8_0"]["advice"]
    assert verification["gguf"]["q8_0"]["passed"] is False
    assert any(kind == "log" and data["level"] == "warning" and data["message"].startswith("Left out gguf-q8_0")
               for _, kind, data in events)


def test_export_progress_is_throttled_within_a_stage_but_keeps_each_stage_start_and_end(settings):
    from lanner.worker.export_process import ExportProcess

    published = []

    class Events:
        def publish(self, event):
            published.append((event.stage, event.fraction))

    get_settings.cache_clear()  # the process reads this test's environment
    process = ExportProcess(1)
    process.events = Events()
    process.progress("merge", 0.0)
    process.progress("merge", 1.0)
    for tensor in range(565):  # one call a tensor, as the GGUF converter makes them
        process.progress("gguf-f16", tensor / 565)
    process.progress("gguf-f16", 1.0)
    process.progress("verify-gguf", 0.5)
    assert published == [("merge", 0.0), ("merge", 1.0), ("gguf-f16", 0.0), ("gguf-f16", 1.0), ("verify-gguf", 0.5)]


def test_an_export_that_fails_its_check_sends_its_figures_in_words_and_as_a_typed_record(settings, trained_adapter,
                                                                                          monkeypatch):
    """Nothing passed: the job fails, its error reads in words (no raw dict), and its stream's
    verification record names each format with the figure it missed, its bound, what the miss means
    and what to do."""
    from lanner.core.messages.records import ExportVerification
    from lanner.worker.export import verify
    from lanner.worker.export_process import ExportProcess
    from lanner.worker.job_process import EXIT_FAILED, main

    monkeypatch.setattr(verify, "MERGED_NOISE_FACTOR", 0.5)  # half of one rounding: the one-cast merge misses it
    monkeypatch.setattr(verify, "MERGED_ABS_SLACK", 0.0)
    get_settings.cache_clear()  # the process reads this test's environment
    owner, parent = trained_job(settings, trained_adapter)
    sessions = db.session_factory(settings.database_url)
    job_id = running_export_job(settings, owner, parent, {"adapter": False, "merged": True, "gguf_types": ["q8_0"]})

    assert main(ExportProcess, ["export_process", str(job_id)]) == EXIT_FAILED

    with sessions() as session:
        error = session.get(Job, job_id).error
    assert error.startswith("Export: Nothing of this export passed its check: The merged model does not match the "
                            "trained adapter: max |logit diff| "), error
    assert "{" not in error and "above its bound" in error
    events = read_after(Redis.from_url(EXPORT_REDIS_URL, decode_responses=True), job_stream(job_id))
    record = ExportVerification.model_validate(next(data for _, kind, data in events if kind == "verification"))
    merged, gguf = record.formats["merged"], record.formats["gguf-q8_0"]
    assert (merged.status, gguf.status) == ("failed", "not made")
    missed = [f for f in merged.figures if not f.passed]
    assert [f.figure for f in missed] == ["max |logit diff|"] and missed[0].measured > missed[0].bound > 0
    assert missed[0].meaning == ("the merged model's logits differ from the trained model's by more than one "
                                 "rounding of its dtype allows")
    assert missed[0].bound == record.model_extra["merged"]["bound_max_abs_logit_diff"]
    assert "float16" in merged.advice and "adapter" in merged.advice
    assert "converted from" in gguf.advice
