"""What the training and export processes share: one job's settings, database, events and the way a
failure ends the process (exit code 1, the reason in the job's `error`, in words for its owner)."""
from __future__ import annotations

import logging
import signal
import traceback
from pathlib import Path

from lanner.core.db import session_factory
from lanner.core.errors import UserError
from lanner.core.models import Artifact, Job, trained_weights
from lanner.core.redis_client import get_redis
from lanner.core.settings import get_settings
from lanner.core.storage import Store, get_store, local_copy
from lanner.worker.events import FLUSH_SECONDS, JobEvents

EXIT_FAILED = 1
EXIT_CANCELLED = 3
# Finished, with some of what was asked for left out (an export format that failed its check): the job
# succeeded with what it kept, and its `error` says what is missing and why.
EXIT_PARTIAL = 4


class JobFailed(Exception):
    """A failure whose message is already clear to the person who launched the job."""


def artifacts_dir(data_dir: Path, job_id: int) -> Path:
    return data_dir / "artifacts" / str(job_id)


class JobProcess:
    failure_prefix = "Job failed"

    def __init__(self, job_id: int):
        self.settings = get_settings()
        self.sessions = session_factory(self.settings.database_url)
        self.job_id = job_id
        self.events = self.job_events()

    def job_events(self) -> JobEvents:
        """Where the job's events go: its Redis stream and the database (`lanner train`: the terminal)."""
        return JobEvents(self.job_id, get_redis(self.settings.redis_url), self.sessions)

    def store_wait(self, message: str) -> None:
        """A wait for an unreachable store, in the job's log."""
        self.events.log(message, level="warning")

    def store(self) -> Store:
        return get_store(self.settings, self.store_wait)

    def data_path(self, stored: str) -> Path:
        """A path the database holds: absolute (`lanner train`'s dataset) as it is, else a store key,
        whose file or folder is the data dir's own or fetched into this host's cache."""
        if Path(stored).is_absolute():
            return Path(stored)
        try:
            return local_copy(self.settings, stored, self.store_wait)
        except FileNotFoundError:
            raise JobFailed(f"{stored} is missing from the store (deleted, or never stored)") from None

    def push(self, path: Path) -> str:
        """Stores a file or folder this process wrote under the data dir (nothing to do with the local
        store); returns its key."""
        key = path.relative_to(self.settings.data_dir).as_posix()
        self.store().put(key, path)
        return key

    def parent_weights(self, session, deleted: str) -> tuple[Job, Job, Artifact | None]:
        """This job, the training job it reads (JobFailed with `deleted` when it is gone), and that
        job's newest adapter or whole model."""
        job = session.get(Job, self.job_id)
        parent = session.get(Job, job.parent_job_id) if job and job.parent_job_id else None
        if parent is None:
            raise JobFailed(deleted)
        return job, parent, trained_weights(session, parent.id)

    def on_sigterm(self, _signum, _frame) -> None:
        raise NotImplementedError

    def run(self) -> int:
        raise NotImplementedError

    def fail(self, message: str) -> int:
        with self.sessions() as session:
            session.get(Job, self.job_id).error = message
            session.commit()
        self.events.log(message, level="error")
        return EXIT_FAILED


def main(process_class: type[JobProcess], argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    process = process_class(int(argv[1]))
    signal.signal(signal.SIGTERM, process.on_sigterm)
    return run_process(process)


def run_process(process: JobProcess) -> int:
    """Runs the job to its exit code, a failure written as the job's error, the events flushed."""
    try:
        return process.run()
    except (JobFailed, UserError) as error:
        return process.fail(str(error))
    except Exception as error:
        traceback.print_exc()
        return process.fail(f"{process.failure_prefix}: {type(error).__name__}: {error}")
    finally:
        process.events.flush(FLUSH_SECONDS)
