"""GET /api/health: the state of the database, Redis and the workers, for people and monitors."""
from __future__ import annotations

from fastapi import APIRouter, Depends
from pydantic import BaseModel
from sqlalchemy.engine import make_url

from lanner.core import db
from lanner.core.messages.device import WorkerRecord
from lanner.core.redis_client import get_redis
from lanner.core.settings import Settings, get_settings
from lanner.core.worker_registry import live_workers

router = APIRouter(tags=["health"])
VERSION = "0.1.0"


class PartHealth(BaseModel):
    ok: bool
    url: str
    detail: str | None = None


class Health(BaseModel):
    status: str
    version: str
    database: PartHealth
    redis: PartHealth
    workers: list[WorkerRecord]


def _database_health(url: str) -> PartHealth:
    shown = make_url(url).render_as_string(hide_password=True)
    try:
        current = db.current_revision(url)
    except Exception as exc:  # any driver error means "down", reported in words
        return PartHealth(ok=False, url=shown, detail=f"cannot connect: {exc.__class__.__name__}: {exc}")
    head = db.head_revision()
    if current != head:
        return PartHealth(ok=False, url=shown, detail=f"schema at {current}, expected {head}: run `lanner migrate`")
    return PartHealth(ok=True, url=shown)


def _redis_health(url: str) -> tuple[PartHealth, list[WorkerRecord]]:
    shown = make_url(url).render_as_string(hide_password=True) if "@" in url else url
    try:
        redis = get_redis(url)
        redis.ping()
        return PartHealth(ok=True, url=shown), live_workers(redis)
    except Exception as exc:
        return PartHealth(ok=False, url=shown, detail=f"cannot connect: {exc}"), []


@router.get("/api/health", response_model=Health)
def health(settings: Settings = Depends(get_settings)) -> Health:
    database = _database_health(settings.database_url)
    redis, workers = _redis_health(settings.redis_url)
    status = "ok" if database.ok and redis.ok and workers else "degraded"
    return Health(status=status, version=VERSION, database=database, redis=redis, workers=workers)
