"""The Celery application. A worker owns one device and runs one job at a time: concurrency 1,
prefetch 1, late acknowledgement (a job on several devices borrows the idle devices of other workers
of its machine: lanner.worker.runner). The queue itself is the database (lanner.core.queue.claim); Celery
messages only wake workers, and a worker also looks at the queue when it starts and while idle.

The solo pool runs the task in the worker's own process, so the training subprocess is the worker's
direct child and dies with it (a prefork pool child would outlive a SIGKILLed parent)."""
from __future__ import annotations

import os
import sys
import threading
import time
import uuid

from celery import Celery
from celery.signals import worker_init, worker_ready, worker_shutdown, worker_shutting_down

from lanner.core.messages.device import Device
from lanner.core.queue.claim import DISPATCH_TASK
from lanner.core.redis_client import get_redis
from lanner.core.settings import get_settings
from lanner.core.streams import HARDWARE_STREAM, SHARED_STREAM_MAXLEN, publish
from lanner.core.worker_registry import (EXIT_NAME_TAKEN, HEARTBEAT_SECONDS, announce_worker, device_holders,
                                         keep_gpu_claim, retire_worker, take_worker_name)
from lanner.worker.devices import current_device, free_memory
from lanner.worker.telemetry import device_sampler

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
    # Each worker also listens on a queue of its own (<name>.dq), so that a wake-up can reach the one
    # worker that has room for a job (its janitor; the end of a job that borrowed its device).
    worker_direct=True,
    include=["lanner.worker.tasks"],
)

JANITOR_SECONDS = 15.0
IDLE_LOOK_SECONDS = 5.0


class WorkerState:
    def __init__(self):
        self.busy = threading.Event()
        self.instance = uuid.uuid4().hex  # this process of the worker, on the jobs it claims


worker_state = WorkerState()

_stop_heartbeat = threading.Event()
_heartbeat_thread: list[threading.Thread] = []


def _heartbeat(name: str, device: Device) -> None:
    """Every HEARTBEAT_SECONDS: this worker's record (with its device's free memory, which other
    workers read to place multi-GPU jobs) and a sample of its device on the hardware stream."""
    redis = get_redis(settings.redis_url)
    sample = device_sampler(device)
    while not _stop_heartbeat.is_set():
        try:
            announce_worker(redis, name, device.with_free_memory(free_memory(device)), worker_state.instance)
            if os.environ.get("LANNER_GPU_CLAIM"):
                keep_gpu_claim(redis, os.environ["LANNER_GPU_CLAIM"], name)
            holder = device_holders(redis, [device.id]).get(device.id)
            reading = sample()
            publish(redis, HARDWARE_STREAM, reading.TYPE,
                    {"worker": name, "device_id": device.id, "name": device.name, "index": device.index,
                     "reserved_by": holder, **reading.data()}, maxlen=SHARED_STREAM_MAXLEN)
        except Exception:  # Redis restarting: keep trying, the key expires meanwhile
            pass
        _stop_heartbeat.wait(HEARTBEAT_SECONDS)


def _janitor(name: str, device: Device) -> None:
    """Fails jobs left running by dead workers, and wakes this worker when a job it could take waits
    while it idles (a wake-up lost with a Redis flush, or taken by a worker that had no room for the
    job, must not strand the queue)."""
    from celery.utils import worker_direct

    from lanner.worker.runner import could_run_a_job, sweep_orphans

    last_sweep = time.monotonic()
    while not _stop_heartbeat.wait(IDLE_LOOK_SECONDS):
        try:
            if time.monotonic() - last_sweep >= JANITOR_SECONDS:
                last_sweep = time.monotonic()
                sweep_orphans(settings, alive=name)
            if not worker_state.busy.is_set() and could_run_a_job(settings, name, device):
                app.send_task(DISPATCH_TASK, queue=worker_direct(name))
        except Exception:  # database or Redis away: try again next round
            pass


@worker_init.connect
def _take_name(sender, **_):
    """Before it consumes anything: a worker whose name a live worker holds (another host with the
    same LANNER_HOST_NAME) is refused, in words."""
    refused = take_worker_name(get_redis(settings.redis_url), sender.hostname, current_device(sender.hostname),
                               worker_state.instance)
    if refused:
        print(f"lanner: {refused}", file=sys.stderr, flush=True)
        os._exit(EXIT_NAME_TAKEN)  # Celery catches exceptions raised in signal handlers


@worker_shutting_down.connect
def _drain(**_):
    """SIGTERM (a warm shutdown): claim nothing more; the running job checkpoints and is queued again."""
    from lanner.worker.runner import draining

    draining.set()


@worker_ready.connect
def _start_heartbeat(sender, **_):
    from lanner.worker.runner import sweep_orphans

    # A previous life of this worker (killed, then restarted under the same name) may have left a
    # job "running". With the solo pool no task runs before this handler returns.
    try:
        sweep_orphans(settings, sender.hostname)
    except Exception as error:
        print(f"lanner: could not sweep the jobs of {sender.hostname}: {error}", flush=True)
    device = current_device(sender.hostname)
    _heartbeat_thread.append(threading.Thread(target=_heartbeat, args=(sender.hostname, device), daemon=True,
                                              name="lanner-heartbeat"))
    _heartbeat_thread[0].start()
    threading.Thread(target=_janitor, args=(sender.hostname, device), daemon=True, name="lanner-janitor").start()
    # Look at the queue at once: jobs may have been queued while no worker ran.
    app.send_task(DISPATCH_TASK)


@worker_shutdown.connect
def _stop(sender, **_):
    _stop_heartbeat.set()
    if _heartbeat_thread:  # a beat in flight would announce this worker again after it retired
        _heartbeat_thread[0].join(timeout=HEARTBEAT_SECONDS)
    try:
        retire_worker(get_redis(settings.redis_url), sender.hostname)
    except Exception:
        pass

