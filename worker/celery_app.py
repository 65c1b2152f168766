"""The Celery application. A worker owns one device and runs one job at a time: concurrency 1,
prefetch 1, late acknowledgement. The queue itself is the database (lanner.backend.queue); Celery
messages only wake workers, and a worker also looks at the queue when it starts and while idle.

The solo pool runs the task in the worker's own process, so the training subprocess is the worker's
direct child and dies with it (a prefork pool child would outlive a SIGKILLed parent)."""
from __future__ import annotations

import os
import threading

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from lanner.backend.queue import DISPATCH_TASK
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
    worker_pool="solo",
    include=["lanner.worker.tasks"],
)

JANITOR_SECONDS = 15.0


class WorkerState:
    def __init__(self):
        self.busy = threading.Event()


worker_state = WorkerState()

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


def _janitor() -> None:
    """Fails jobs left running by dead workers, and wakes this worker when jobs wait while it idles
    (a wake-up message lost with a Redis flush must not strand the queue)."""
    from lanner.backend.db import session_factory
    from lanner.backend.queue import has_runnable_job
    from lanner.worker.runner import sweep_orphans

    device = current_device()
    while not _stop_heartbeat.wait(JANITOR_SECONDS):
        try:
            sweep_orphans(settings)
            if not worker_state.busy.is_set():
                with session_factory(settings.database_url)() as session:
                    waiting = has_runnable_job(session, device)
                if waiting:
                    app.send_task(DISPATCH_TASK)
        except Exception:  # database or Redis away: try again next round
            pass


@worker_ready.connect
def _start_heartbeat(sender, **_):
    from lanner.worker.runner import sweep_orphans

    # A previous life of this worker (killed, then restarted under the same name) may have left a
    # job "running". With the solo pool no task runs before this handler returns.
    try:
        sweep_orphans(settings, sender.hostname)
    except Exception as error:
        print(f"lanner: could not sweep the jobs of {sender.hostname}: {error}", flush=True)
    threading.Thread(target=_heartbeat, args=(sender.hostname, current_device()), daemon=True,
                     name="lanner-heartbeat").start()
    threading.Thread(target=_janitor, daemon=True, name="lanner-janitor").start()
    # Look at the queue at once: jobs may have been queued while no worker ran.
    app.send_task(DISPATCH_TASK)


@worker_shutdown.connect
def _stop(sender, **_):
    _stop_heartbeat.set()
    try:
        retire_worker(get_redis(settings.redis_url), sender.hostname)
    except Exception:
        pass

