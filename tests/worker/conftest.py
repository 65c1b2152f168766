"""Fixtures for the worker's tests (the helpers they use are in worker_helpers.py)."""
from __future__ import annotations

import uuid

import pytest
from redis import Redis

from support import WORKER_REDIS_URL
from worker_helpers import CeleryWorker, Studio


def _clean_redis() -> Redis:
    redis = Redis.from_url(WORKER_REDIS_URL, decode_responses=True)
    redis.flushdb()
    return redis


@pytest.fixture
def studio(tmp_path, smollm2_dir) -> Studio:
    yield from _studio(tmp_path / "data", smollm2_dir, f"sqlite:///{tmp_path / 'data' / 'lanner.db'}")


def _studio(data_dir, smollm2_dir, url: str):
    from lanner.core import db
    from lanner.core.models import User

    (data_dir / "models").mkdir(parents=True)
    (data_dir / "models" / "SmolLM2-135M-Instruct").symlink_to(smollm2_dir)
    db.migrate(url)
    with db.session_factory(url)() as session:
        user = User(email=f"{uuid.uuid4().hex}@example.com", display_name="T", role="member", password_hash="x")
        session.add(user)
        session.commit()
        owner = user.id
    redis = _clean_redis()
    yield Studio(data_dir, url, redis, owner)
    redis.flushdb()


@pytest.fixture
def celery_worker(request):
    workers: list[CeleryWorker] = []

    def start(name: str = "cpu0", host: str | None = None) -> CeleryWorker:
        workers.append(CeleryWorker(request.getfixturevalue("studio"), name, host))
        return workers[-1].wait_ready()

    yield start
    for worker in workers:
        worker.stop()
