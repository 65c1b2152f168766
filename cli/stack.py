"""`lanner up`: the whole studio on one machine — Redis (found or started), the API, and one Celery
worker per visible GPU (one CPU worker when there is none). Ctrl-C stops what it started, nothing else."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from lanner.core import db, default_model
from lanner.core.settings import Settings
from lanner.cli.llama_cpp_build import say_status
from lanner.cli.redis_server import answers, start_local_redis
from lanner.inference.availability import llama_cpp_status
from lanner.worker.devices import gpu_count

READY_TIMEOUT_SECONDS = 180


@dataclass
class Child:
    name: str
    process: subprocess.Popen
    log: Path
    command: list[str] = field(default_factory=list)
    extra_env: dict = field(default_factory=dict)
    one_shot: bool = False  # ends when its work is done: neither started again nor a reason to stop the studio


IMPORT_CHILD = "builtin-model-import"


def start_builtin_import(settings: Settings) -> subprocess.Popen | None:
    """Imports the built-in model in a process of its own (`lanner import-default-model`, log in
    DATA_DIR/logs), so that the studio answers meanwhile; None when it is imported or being imported."""
    if default_model.is_imported(settings.models_dir) or default_model.import_started_at(settings.models_dir):
        return None
    with open(settings.logs_dir / f"{IMPORT_CHILD}.log", "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "lanner.cli.main", "import-default-model"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=settings.data_dir, start_new_session=True,
                                env={**os.environ, "LANNER_DATA_DIR": str(settings.data_dir)})


def _health(url: str, timeout: float = 2.0) -> dict | None:
    try:
        with urllib.request.urlopen(f"{url}/api/health", timeout=timeout) as response:
            return json.load(response)
    except urllib.error.HTTPError as error:
        return json.load(error) if error.code < 500 else None
    except (OSError, ValueError):
        return None


def _port_taken(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex((host, port)) == 0


def child_env(settings: Settings, extra_env: dict) -> dict:
    """The environment of a process this host starts: its settings, whatever they were read from."""
    return {**os.environ, **extra_env, "PYTHONUNBUFFERED": "1", "LANNER_DATA_DIR": str(settings.data_dir),
            "LANNER_DATABASE_URL": settings.database_url, "LANNER_REDIS_URL": settings.redis_url,
            "LANNER_HOST_NAME": settings.host_name}


def worker_command(name: str, host_name: str) -> list[str]:
    """A Celery worker named name@host_name (LANNER_HOST_NAME: the host in placement and the hardware page)."""
    return [sys.executable, "-m", "celery", "-A", "lanner.worker.celery_app", "worker",
            "--concurrency", "1", "--prefetch-multiplier", "1", "--without-gossip", "--without-mingle",
            "--loglevel", "INFO", "-n", f"{name}@{host_name}"]


def visible_gpus() -> list[str]:
    """The GPUs this studio may use: those CUDA_VISIBLE_DEVICES names when it is set, else all of them."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [entry.strip() for entry in visible.split(",") if entry.strip() not in ("", "-1")]
    return [str(index) for index in range(gpu_count())]


def worker_envs() -> list[tuple[str, dict]]:
    """One (name, extra environment) per worker: a GPU each, or the CPU when there is no GPU."""
    gpus = visible_gpus() if gpu_count() else []
    if not gpus:
        return [("cpu0", {"CUDA_VISIBLE_DEVICES": ""})]
    return [(f"gpu{number}", {"CUDA_VISIBLE_DEVICES": gpu}) for number, gpu in enumerate(gpus)]


REDIS_CHILD = "redis"


class Stack:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.children: list[Child] = []
        self.llama_cpp_state: str | None = None  # as last printed
        self.url = f"http://{'127.0.0.1' if settings.host in ('0.0.0.0', '::') else settings.host}:{settings.port}"

    def _spawn(self, name: str, command: list[str], extra_env: dict | None = None) -> None:
        log = self.settings.logs_dir / f"{name}.log"
        env = child_env(self.settings, extra_env or {})
        with open(log, "ab") as out:
            # cwd is the data dir, not the checkout: from the checkout's root, `python -m` would make
            # backend/, worker/ and kernels/ importable as top-level names that shadow other packages.
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                       env=env, cwd=self.settings.data_dir, start_new_session=True)
        self.children.append(Child(name, process, log, command, extra_env or {}))

    def start(self) -> None:
        settings = self.settings
        settings.ensure_dirs()
        if _port_taken("127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host, settings.port):
            if _health(self.url) and "workers" in (_health(self.url) or {}):
                print(f"Lanner is already running at {self.url}; nothing to start.", flush=True)
                raise SystemExit(0)
            raise SystemExit(f"Port {settings.port} is taken by another program: set LANNER_PORT to a free port.")

        print(f"Data directory: {settings.data_dir}", flush=True)
        db.migrate(settings.database_url)
        print("Database: migrated to the latest schema.", flush=True)

        if answers(settings.redis_url):
            print(f"Redis: using {settings.redis_url}", flush=True)
        else:
            print(f"Redis: nothing answers at {settings.redis_url}; starting a local redis-server.", flush=True)
            self._start_redis()

        importing = start_builtin_import(settings)
        if importing:
            print("The built-in model is being imported in the background (about a minute; dataset previews wait "
                  "for it).", flush=True)
            self.children.append(Child(IMPORT_CHILD, importing, settings.logs_dir / f"{IMPORT_CHILD}.log", one_shot=True))
        self._spawn("api", [sys.executable, "-m", "uvicorn", "lanner.backend.app:create_app", "--factory",
                            "--host", settings.host, "--port", str(settings.port), "--log-level", settings.log_level])
        workers = worker_envs()
        for name, env in workers:
            self._spawn(f"worker-{name}", worker_command(name, settings.host_name), env)
        self._wait_until_ready(len(workers))
        print(f"Lanner is up: {self.url}  (logs in {settings.logs_dir}; Ctrl-C stops it)", flush=True)
        self.report_llama_cpp()

    def report_llama_cpp(self) -> None:
        """Says how llama.cpp stands, and again when that changes (./lanner builds it in the background)."""
        status = llama_cpp_status()
        if status.state != self.llama_cpp_state:
            self.llama_cpp_state = status.state
            print(say_status(status), flush=True)

    def _wait_until_ready(self, expected_workers: int) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        state = None
        while time.monotonic() < deadline:
            self.check_children()
            state = _health(self.url)
            if state and state["database"]["ok"] and state["redis"]["ok"] and len(state["workers"]) >= expected_workers:
                return
            time.sleep(0.5)
        raise SystemExit(f"Lanner did not come up within {READY_TIMEOUT_SECONDS} s; last health: {state}. "
                         f"Logs: {self.settings.logs_dir}")

    def _start_redis(self) -> None:
        settings = self.settings
        process = start_local_redis(settings.redis_url, settings.data_dir / "redis", settings.logs_dir / "redis.log")
        self.children.append(Child(REDIS_CHILD, process, settings.logs_dir / "redis.log"))

    def check_children(self, restart_workers: bool = False) -> None:
        """A dead worker is started again (its job goes back to the queue through late acks), and so
        is the Redis `up` started (from its snapshot: the API answers 503 and streams wait meanwhile);
        a dead API stops the studio, since nothing works without it."""
        for index, child in enumerate(self.children):
            code = child.process.poll()
            if code is None:
                continue
            if child.one_shot:
                print("The built-in model is imported." if code == 0 else
                      f"The built-in model's import failed (exit code {code}; log: {child.log}); the first job "
                      "tries again, or run `lanner import-default-model`.", flush=True)
                self.children.pop(index)
                return
            if restart_workers and (child.name.startswith("worker-") or child.name == REDIS_CHILD):
                print(f"{child.name} stopped (exit code {code}); starting it again.", flush=True)
                self.children.pop(index)
                if child.name == REDIS_CHILD:
                    self._start_redis()
                else:
                    self._spawn(child.name, child.command, child.extra_env)
                return
            tail = child.log.read_text(errors="replace")[-2000:] if child.log.exists() else ""
            raise SystemExit(f"{child.name} stopped (exit code {code}). End of {child.log}:\n{tail}")

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.process.poll() is None:
                os.killpg(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        for child in reversed(self.children):
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(child.process.pid, signal.SIGKILL)
                child.process.wait()
        self.children.clear()


def up(settings: Settings) -> None:
    stack = Stack(settings)

    def request_stop(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, request_stop)
    # Ctrl-C stops the studio even when `up` was started from a non-interactive shell's background
    # job, which starts its children with SIGINT ignored.
    signal.signal(signal.SIGINT, request_stop)
    try:
        stack.start()
        while True:
            stack.check_children(restart_workers=True)
            stack.report_llama_cpp()
            time.sleep(1)
    except KeyboardInterrupt:
        print("\nStopping Lanner…", flush=True)
    finally:
        stack.stop()
        print("Stopped.", flush=True)
