"""GET /api/health: the state of the database, Redis and the workers, for people and monitors, and
whether llama.cpp is ready (./lanner builds it in the background on the first `up`; its state does not
make the studio degraded). Anyone may ask (monitors and `lanner up` are not signed in); only a signed-in
user sees where the database and Redis are, why a part is down, the workers' hosts (the workers come
grouped by host) and device names and where llama.cpp's build log is."""
from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel
from sqlalchemy.engine import make_url

from lanner.backend.deps import signed_in_or_none
from lanner.core import db
from lanner.core.messages.device import Device, WorkerRecord
from lanner.core.redis_client import get_redis
from lanner.core.settings import Settings, get_settings
from lanner.core.worker_registry import live_workers
from lanner.inference.availability import LlamaCppStatus, llama_cpp_status

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
    llama_cpp: LlamaCppStatus


def _database_health(url: str) -> PartHealth:
    problem = db.schema_problem(url)
    return PartHealth(ok=problem is None, url=make_url(url).render_as_string(hide_password=True), detail=problem)


def _redis_health(url: str) -> tuple[PartHealth, list[WorkerRecord]]:
    shown = make_url(url).render_as_string(hide_password=True) if "@" in url else url
    try:
        redis = get_redis(url)
        redis.ping()
        return PartHealth(ok=True, url=shown), live_workers(redis)
    except Exception as exc:
        return PartHealth(ok=False, url=shown, detail=f"{db.CANNOT_CONNECT}: {exc}"), []


def _anonymous_part(part: PartHealth) -> PartHealth:
    """The part's URL without its host, port, path or database name; the reason without what follows
    `cannot connect` (a driver's message names files and hosts)."""
    detail = db.CANNOT_CONNECT if part.detail and part.detail.startswith(db.CANNOT_CONNECT) else part.detail
    return PartHealth(ok=part.ok, url=part.url.split("://", 1)[0] + ":///", detail=detail)


def _anonymous_worker(worker: WorkerRecord) -> WorkerRecord:
    device = Device(kind=worker.device.kind, name=worker.device.kind, memory_total_bytes=worker.device.memory_total_bytes,
                    memory_free_bytes=worker.device.memory_free_bytes)
    return WorkerRecord(name=worker.name.split("@", 1)[0], device=device, last_seen=worker.last_seen,
                        reserved_by=worker.reserved_by.split("@", 1)[0] if worker.reserved_by else None)


@router.get("/api/health", response_model=Health)
def health(request: Request, settings: Settings = Depends(get_settings)) -> Health:
    database = _database_health(settings.database_url)
    redis, workers = _redis_health(settings.redis_url)
    status = "ok" if database.ok and redis.ok and workers else "degraded"
    llama_cpp = llama_cpp_status()
    if not database.ok or signed_in_or_none(request, settings) is None:
        database, redis = _anonymous_part(database), _anonymous_part(redis)
        workers = [_anonymous_worker(worker) for worker in workers]
        llama_cpp = llama_cpp.model_copy(update={"log": None})
    return Health(status=status, version=VERSION, database=database, redis=redis, workers=workers,
                  llama_cpp=llama_cpp)
