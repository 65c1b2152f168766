"""The Celery application. A worker owns one device and runs one job at a time: concurrency 1,
prefetch 1 and late acknowledgement, so a job whose worker dies goes back to the queue."""
from __future__ import annotations

import os
import threading

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from lanner.backend.redis_client import get_redis
from lanner.backend.settings import get_settings
from lanner.backend.worker_registry import HEARTBEAT_SECONDS, announce_worker, keep_gpu_claim, retire_worker
from lanner.worker.devices import current_device

settings = get_settings()
app = Celery("lanner", broker=settings.redis_url)
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    worker_concurrency=1,
    broker_connection_retry_on_startup=True,
    task_serializer="json",
    accept_content=["json"],
    worker_hijack_root_logger=False,
)

_stop_heartbeat = threading.Event()


def _heartbeat(name: str, device: dict) -> None:
    redis = get_redis(settings.redis_url)
    while not _stop_heartbeat.is_set():
        try:
            announce_worker(redis, name, device)
            if os.environ.get("LANNER_GPU_CLAIM"):
                keep_gpu_claim(redis, os.environ["LANNER_GPU_CLAIM"], name)
        except Exception:  # Redis restarting: keep trying, the key expires meanwhile
            pass
        _stop_heartbeat.wait(HEARTBEAT_SECONDS)


@worker_ready.connect
def _start_heartbeat(sender, **_):
    threading.Thread(target=_heartbeat, args=(sender.hostname, current_device()), daemon=True,
                     name="lanner-heartbeat").start()


@worker_shutdown.connect
def _stop(sender, **_):
    _stop_heartbeat.set()
    try:
        retire_worker(get_redis(settings.redis_url), sender.hostname)
    except Exception:
        pass

