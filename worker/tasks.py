"""Celery tasks. "lanner.dispatch" carries no job: it tells the worker to look at the database queue,
so that order and priority stay the database's and a lost or duplicated message costs nothing."""
from __future__ import annotations

from lanner.core.queue.claim import DISPATCH_TASK
from lanner.core.settings import get_settings
from lanner.worker.celery_app import app, worker_state
from lanner.worker.devices import current_device
from lanner.worker.runner import run_queue


@app.task(name=DISPATCH_TASK, bind=True, ignore_result=True)
def dispatch(self) -> list[int]:
    worker_state.busy.set()
    try:
        return run_queue(get_settings(), self.request.hostname, current_device(self.request.hostname),
                         worker_state.instance)
    finally:
        worker_state.busy.clear()
