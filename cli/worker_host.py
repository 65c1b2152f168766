"""`lanner worker`: a worker host. It needs only the database URL, the Redis URL, the store settings
and its GPUs (docs/multi-host.md). It checks first that the database answers at the latest schema and
that Redis answers, and says which does not; then it runs one Celery worker per visible GPU (one CPU
worker when there is none), starts again a worker that dies, and on SIGTERM (or Ctrl-C) drains: each
worker claims nothing more, and a running job saves a checkpoint at the end of its step and goes back
to the queue, for this host or another to resume."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sqlalchemy.engine import make_url

from lanner.cli.redis_server import answers
from lanner.cli.stack import child_env, worker_command, worker_envs
from lanner.core import db
from lanner.core.settings import Settings
from lanner.core.worker_registry import EXIT_NAME_TAKEN


def preflight_problems(settings: Settings) -> list[str]:
    """What keeps this host from working, in words (empty: nothing)."""
    problems = []
    problem = db.schema_problem(settings.database_url)
    if problem:
        shown = make_url(settings.database_url).render_as_string(hide_password=True)
        problems.append(f"The database at {shown} is not usable: {problem} "
                        "(on the studio's host; a worker host never migrates). Set LANNER_DATABASE_URL to the "
                        "studio's database.")
    if not answers(settings.redis_url):
        problems.append(f"Redis does not answer at {settings.redis_url}. Set LANNER_REDIS_URL to the studio's Redis.")
    return problems


def preflight(settings: Settings) -> None:
    problems = preflight_problems(settings)
    if problems:
        raise SystemExit("lanner worker: cannot start.\n" + "\n".join(f"- {problem}" for problem in problems))


class WorkerHost:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.workers: dict[str, tuple[subprocess.Popen, dict]] = {}  # name -> (process, extra environment)
        self.stopping = False

    def _spawn(self, name: str, extra_env: dict) -> None:
        settings = self.settings
        env = child_env(settings, extra_env)
        # Its own process group (the training process joins it): a drain signals the worker and its job.
        # cwd: the data dir, so that `python -m` does not make the checkout's folders importable.
        process = subprocess.Popen(worker_command(name, settings.host_name), stdin=subprocess.DEVNULL, env=env,
                                   cwd=settings.data_dir, start_new_session=True)
        self.workers[name] = (process, extra_env)

    def start(self) -> None:
        for name, env in worker_envs():
            self._spawn(name, env)
        print(f"Worker host {self.settings.host_name}: {', '.join(self.workers)} "
              f"(database and Redis answer; SIGTERM drains)", flush=True)

    def watch(self) -> None:
        """Starts again a worker that died (its job is requeued by the sweep), until a drain."""
        while not self.stopping:
            for name, (process, env) in list(self.workers.items()):
                if process.poll() == EXIT_NAME_TAKEN:  # it said why; another try would be refused again
                    self.drain()
                    return
                if process.poll() is not None and not self.stopping:
                    print(f"worker {name}@{self.settings.host_name} stopped (exit code {process.returncode}); "
                          "starting it again.", flush=True)
                    self._spawn(name, env)
            time.sleep(1)

    def drain(self, _signum=None, _frame=None) -> None:
        """The first signal drains (each worker finishes its step, checkpoints and requeues its job);
        a second one stops the workers at once."""
        how = signal.SIGKILL if self.stopping else signal.SIGTERM
        if not self.stopping:
            print(f"Draining worker host {self.settings.host_name}: running jobs checkpoint and go back to the "
                  "queue (signal again to stop at once).", flush=True)
        self.stopping = True
        for process, _env in self.workers.values():
            if process.poll() is None:
                try:
                    os.killpg(process.pid, how)
                except ProcessLookupError:
                    pass

    def wait(self) -> int:
        codes = [process.wait() for process, _env in self.workers.values()]
        print(f"Worker host {self.settings.host_name} stopped.", flush=True)
        return 0 if not any(codes) else 1


def run_worker_host(settings: Settings) -> int:
    preflight(settings)
    host = WorkerHost(settings)
    signal.signal(signal.SIGTERM, host.drain)
    signal.signal(signal.SIGINT, host.drain)
    host.start()
    host.watch()
    return host.wait()


def run_one_worker(settings: Settings, name: str) -> None:
    """One worker in this process (a container per GPU: `--gpu`), once preflight passed."""
    command = worker_command(name, settings.host_name)
    sys.stdout.flush()
    os.execv(command[0], command)
