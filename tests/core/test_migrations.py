"""Alembic owns the schema, on SQLite and on PostgreSQL alike."""
from __future__ import annotations

import json

from sqlalchemy import MetaData, Table, inspect

from lanner.core import db


def test_migrations_go_up_and_down(database_url):
    assert db.current_revision(database_url) is None
    db.migrate(database_url)
    assert db.current_revision(database_url) == db.head_revision()
    assert {"users", "jobs", "datasets", "artifacts", "job_metrics", "device_samples", "api_tokens"} <= set(
        inspect(db.get_engine(database_url)).get_table_names())
    db.migrate(database_url)  # running it twice is safe
    from alembic import command

    command.downgrade(db.alembic_config(database_url), "base")
    assert "users" not in inspect(db.get_engine(database_url)).get_table_names()
    db.get_engine(database_url).dispose()


def test_the_models_match_the_migrations(database_url):
    """A model change without its migration shows up here as a difference."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    db.migrate(database_url)
    with db.get_engine(database_url).connect() as connection:
        differences = compare_metadata(MigrationContext.configure(connection), db.Base.metadata)
    db.get_engine(database_url).dispose()
    assert differences == []


# A training job's config as the API stored it before the spec had a version: the nested spec and the
# training process's flat names side by side (the old save_steps was empty: the worker saved every 50).
NESTED_AND_FLAT = {
    "method": "dpo", "model": "builtin/SmolLM2-135M-Instruct", "dataset_id": None, "name": "pairs", "preset": None,
    "hyperparameters": {"learning_rate": 5e-6, "epochs": 3, "max_steps": None, "batch_size": 4,
                        "gradient_accumulation": 4, "max_seq_len": 2048, "warmup_ratio": 0.03, "weight_decay": 0.0,
                        "lr_scheduler": "cosine", "precision": "auto", "gradient_checkpointing": True,
                        "packing": False, "seed": 42, "save_steps": None, "eval_fraction": 0.0,
                        "before_after_eval": True, "use_kernels": True, "oom_retry": True,
                        "memory_budget_gib": None, "offload_checkpoints": False},
    "lora": {"rank": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": "all-linear"},
    "preference": {"beta": 0.2, "max_prompt_len": None}, "priority": 0, "gpus": 1, "resume_from": None,
    "num_train_epochs": 3, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 4,
    "learning_rate": 5e-6, "lr_scheduler_type": "cosine", "max_seq_length": 2048, "dtype": "auto",
    "validation_split": 0.0, "lora_r": 8, "lora_alpha": 16.0, "dpo_beta": 0.2, "memory_limit_mb": 900}
# A job written straight into the database with the training process's flat names (and its defaults).
FLAT = {"max_steps": 4, "per_device_train_batch_size": 2, "max_seq_length": 64, "lora_r": 4,
        "target_modules": ["q_proj", "v_proj"], "dtype": "float32", "requeue_on_worker_loss": True}
EXPORT = {"export": {"adapter": True, "merged": False, "gguf_types": ["q8_0"]}}


def test_0003_and_0004_store_each_training_jobs_spec_under_its_version(database_url):
    from datetime import datetime, timezone

    from sqlalchemy import text

    from lanner.core.spec import SPEC_VERSION, load_spec

    db.migrate(database_url, "0002")
    # The table as 0002 made it (the model's has later columns).
    jobs_at_0002 = Table("jobs", MetaData(), autoload_with=db.get_engine(database_url))
    engine = db.get_engine(database_url)
    now = datetime.now(timezone.utc)
    with engine.begin() as connection:
        connection.execute(text("INSERT INTO users (id, email, display_name, role, password_hash, is_active, created_at) "
                                "VALUES (1, 'a@example.com', 'A', 'admin', 'x', true, :now)"), {"now": now})
        for job_id, kind, method, config in [(1, "train", "dpo", NESTED_AND_FLAT), (2, "train", "lora", FLAT),
                                             (3, "train", "kto", {"max_steps": 2}), (4, "export", "export", EXPORT)]:
            connection.execute(jobs_at_0002.insert().values(
                id=job_id, owner_id=1, kind=kind, name=f"job {job_id}", method=method,
                model="builtin/SmolLM2-135M-Instruct", dataset_id=None, config=config, status="succeeded",
                priority=0, queue_order=job_id, gpus=0, step=0, created_at=now))
    db.migrate(database_url)

    with engine.connect() as connection:
        configs = dict(connection.execute(text("SELECT id, config FROM jobs")).all())
    configs = {job_id: config if isinstance(config, dict) else json.loads(config) for job_id, config in configs.items()}
    assert all(set(configs[job_id]) == {"version", "spec"} and configs[job_id]["version"] == SPEC_VERSION
               for job_id in (1, 2, 3))
    assert configs[4] == EXPORT
    for config in configs.values():  # a job whose dataset was deleted keeps the id its spec was given
        config.get("spec", {})["dataset_id"] = 7
    nested = load_spec(configs[1])
    assert (nested.method, nested.hyperparameters.learning_rate, nested.lora.rank, nested.preference.beta) == (
        "dpo", 5e-6, 8, 0.2)
    assert (nested.hyperparameters.save_steps, nested.hyperparameters.memory_limit_mb) == (50, 900)
    # 0004: a job that never said it keeps the old default (off), though version 2 requeues by default.
    assert nested.requeue_on_worker_loss is False
    flat = load_spec(configs[2])
    hp = flat.hyperparameters
    assert (hp.max_steps, hp.batch_size, hp.max_seq_len, hp.precision) == (4, 2, 64, "fp32")
    # The defaults the worker gave a flat config then, not the spec's.
    assert (hp.gradient_accumulation, hp.lr_scheduler, hp.warmup_ratio, hp.eval_fraction, hp.learning_rate) == (
        1, "linear", 0.0, 0.1, 2e-4)
    assert (flat.lora.rank, flat.lora.alpha, flat.lora.target_modules, flat.requeue_on_worker_loss) == (
        4, 16, ["q_proj", "v_proj"], True)
    assert load_spec(configs[3]).lora is None  # a preference job without LoRA settings trains every weight

    from alembic import command

    command.downgrade(db.alembic_config(database_url), "0002")
    with engine.connect() as connection:
        downgraded = dict(connection.execute(text("SELECT id, config FROM jobs WHERE id IN (1, 2)")).all())
    downgraded = {job_id: config if isinstance(config, dict) else json.loads(config)
                  for job_id, config in downgraded.items()}
    assert downgraded[1]["per_device_train_batch_size"] == 4 and downgraded[1]["dpo_beta"] == 0.2
    assert downgraded[1]["hyperparameters"]["learning_rate"] == 5e-6 and downgraded[1]["memory_limit_mb"] == 900
    assert (downgraded[2]["lora_r"], downgraded[2]["dtype"], downgraded[2]["requeue_on_worker_loss"]) == (
        4, "float32", True)
    engine.dispose()


def test_0007_adds_the_host_and_worker_instance_of_a_job_and_takes_them_away_again(database_url):
    from alembic import command

    db.migrate(database_url, "0006")
    engine = db.get_engine(database_url)
    assert not {"host", "worker_instance"} & {column["name"] for column in inspect(engine).get_columns("jobs")}
    db.migrate(database_url)
    assert {"host", "worker_instance"} <= {column["name"] for column in inspect(engine).get_columns("jobs")}
    command.downgrade(db.alembic_config(database_url), "0006")
    assert not {"host", "worker_instance"} & {column["name"] for column in inspect(engine).get_columns("jobs")}
    engine.dispose()


def test_0008_a_deleted_id_is_never_given_again_and_every_row_stays(database_url):
    """SQLite handed the newest row's id to the next one once it was deleted; 0008 copies the tables into
    AUTOINCREMENT ones (PostgreSQL's sequences never went back)."""
    from alembic import command

    from lanner.core.models import Dataset, Job, JobMetric, Role, User

    db.migrate(database_url, "0007")
    sessions = db.session_factory(database_url)

    def new_job(session, owner, **fields):
        job = Job(owner_id=owner, name="j", method="lora", model="m", config={}, **fields)
        session.add(job)
        session.commit()
        return job.id

    with sessions() as session:
        user = User(email="a@example.com", display_name="A", role=Role.admin, password_hash="x")
        session.add(user)
        session.commit()
        dataset = Dataset(owner_id=user.id, name="d", filename="d.jsonl", path="d", size_bytes=1)
        session.add(dataset)
        session.commit()
        parent = new_job(session, user.id, dataset_id=dataset.id)
        child = new_job(session, user.id, parent_job_id=parent)
        session.add(JobMetric(job_id=parent, step=1, values={"loss": 1.0}))
        session.commit()
    db.migrate(database_url)
    with sessions() as session:
        assert (session.get(Job, child).parent_job_id, session.get(Job, parent).dataset_id) == (parent, dataset.id)
        assert session.query(JobMetric).filter_by(job_id=parent).count() == 1
        session.delete(session.get(Job, child))
        session.delete(session.get(Dataset, dataset.id))
        session.commit()
        assert new_job(session, user.id) > child
        again = Dataset(owner_id=user.id, name="d", filename="d.jsonl", path="d", size_bytes=1)
        session.add(again)
        session.commit()
        assert again.id > dataset.id
        session.delete(session.get(Job, parent))  # foreign keys still cascade in the copied tables
        session.commit()
        assert session.query(JobMetric).count() == 0
    command.downgrade(db.alembic_config(database_url), "0007")
    with sessions() as session:
        assert session.query(Job).count() == 1 and session.query(User).count() == 1
    db.get_engine(database_url).dispose()
