"""Helpers shared by the test folders (fixtures live in conftest.py)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST_CACHE = Path(os.environ.get("LANNER_TEST_CACHE", Path.home() / ".cache" / "lanner-tests"))
POSTGRES_ADMIN_URL = os.environ.get("LANNER_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
SYSTEM_REDIS_URL = os.environ.get("LANNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# A Redis database of the worker tests' own, emptied before each test (other suites use 11, 13, 14;
# 12 turned out to be written by other tests on this machine).
WORKER_REDIS_URL = SYSTEM_REDIS_URL.rsplit("/", 1)[0] + "/" + os.environ.get("LANNER_TEST_WORKER_REDIS_DB", "15")
# the virtualenv's `lanner`; on the lent GPU machine, tools/device/env.sh names its own
LANNER_BIN = os.environ.get("LANNER_TEST_BIN") or str(Path(sys.executable).with_name("lanner"))


@contextmanager
def fresh_postgres_database():
    """The URL of a new PostgreSQL database, dropped when the block ends."""
    import pytest
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"lanner_test_{uuid.uuid4().hex[:10]}"
    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:
        pytest.fail(f"PostgreSQL is needed at {POSTGRES_ADMIN_URL} (set LANNER_TEST_POSTGRES_URL): {exc}")
    try:
        yield make_url(POSTGRES_ADMIN_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        from lanner.core.db import get_engine

        get_engine.cache_clear()
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class WebhookReceiver(ThreadingHTTPServer):
    """An HTTP server on a free localhost port, in a thread, that records each POST (headers, raw body)
    and answers it with the next of `answers` (then 200): what a webhook's owner runs. `hold`: it
    answers only once that event is set (a slow receiver); `tls`: it speaks HTTPS with that context."""

    def __init__(self, answers: list[int] = (), hold: threading.Event | None = None, tls=None):
        self.answers, self.requests = list(answers), []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(handler):
                body = handler.rfile.read(int(handler.headers["Content-Length"]))
                self.requests.append((dict(handler.headers), body))
                if hold is not None:
                    hold.wait(30)
                handler.send_response(self.answers.pop(0) if self.answers else 200)
                handler.end_headers()

            def log_message(handler, *_):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        if tls is not None:
            self.socket = tls.wrap_socket(self.socket, server_side=True)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


def get_json(url: str, timeout: float = 5.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.load(response)


class RunningStack:
    """`lanner up` in a subprocess, with its own data dir and port."""

    def __init__(self, data_dir: Path, env: dict):
        self.data_dir = data_dir
        self.env = env
        self.output: list[str] = []
        self.url: str | None = None
        self.process = subprocess.Popen([LANNER_BIN, "up"], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                        start_new_session=True)
        self._up = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.output.append(line)
            if line.startswith("Lanner is up: "):
                self.url = line.split()[3]
                self._up.set()

    def wait_up(self, timeout: float = 240) -> "RunningStack":
        deadline = time.monotonic() + timeout
        while not self._up.wait(0.5) and self.process.poll() is None and time.monotonic() < deadline:
            pass  # `up` prints its URL, or stops (a part that did not start), or runs out of time
        if not self._up.is_set():
            self.stop()
            raise AssertionError("lanner up did not come up:\n" + "".join(self.output))
        return self

    def health(self) -> dict:
        return get_json(f"{self.url}/api/health")

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)


def process_env() -> dict:
    """The environment for a studio process a test starts: this one's without its LANNER_* settings (the test
    sets its own) and without TRITON_INTERPRET, which tests/kernels sets for the whole session on a CPU box. A
    studio on the CPU trains on plain PyTorch; with it set, on the Triton kernels run by the interpreter
    (`lanner train` of two SmolLM2 steps: 140 s against 11)."""
    return {key: value for key, value in os.environ.items()
            if not key.startswith("LANNER_") and key != "TRITON_INTERPRET"}


def stack_env(tmp: Path, redis_url: str) -> dict:
    env = process_env()
    env.update(LANNER_DATA_DIR=str(tmp / "data"), LANNER_PORT=str(free_port()), LANNER_REDIS_URL=redis_url)
    return env
