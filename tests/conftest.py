"""Fixtures on real parts: a Redis, SQLite and PostgreSQL databases, the built-in SmolLM2, and the
whole studio started the way `./lanner up` starts it."""
from __future__ import annotations

import os
from pathlib import Path

import torch

# Without a GPU the kernels (and the NF4 quantiser that tests of the estimate and the export reach too) run
# under Triton's interpreter; this must be set before triton is imported (transformers' model modules import
# it), so it lives at the top of the root conftest, whichever folder of tests runs.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def _start_redis_of_this_worker() -> None:
    """Under pytest-xdist (`./lanner test` runs the whole suite on several workers) each worker gets a Redis
    server of its own, whatever LANNER_TEST_REDIS_URL says: the test folders empty their Redis databases before
    each test, so one Redis shared by two workers would lose a test's queue to the other's. It must be named
    before support.py, which reads LANNER_TEST_REDIS_URL when imported."""
    import atexit
    import shutil
    import socket
    import tempfile

    from lanner.cli.redis_server import start_local_redis

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"redis://127.0.0.1:{sock.getsockname()[1]}/0"
    folder = Path(tempfile.mkdtemp(prefix="lanner-test-redis-"))
    server = start_local_redis(url, folder, folder / "redis.log")

    def stop() -> None:
        server.terminate()
        server.wait(10)
        shutil.rmtree(folder, ignore_errors=True)

    atexit.register(stop)
    os.environ["LANNER_TEST_REDIS_URL"] = url


if os.environ.get("PYTEST_XDIST_WORKER"):
    _start_redis_of_this_worker()

from support import TEST_CACHE, RunningStack, fresh_postgres_database, free_port, stack_env  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The built-in SmolLM2-135M-Instruct as a Hugging Face checkpoint (imported once per machine)."""
    from lanner.core.default_model import imported_model_dir

    return imported_model_dir(TEST_CACHE / "models")


@pytest.fixture
def postgres_url():
    """A fresh PostgreSQL database for one test, dropped at its end."""
    with fresh_postgres_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lanner.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture(scope="session")
def stack(tmp_path_factory):
    """The whole studio, as `./lanner up` starts it, on a Redis of its own that it starts itself."""
    tmp = tmp_path_factory.mktemp("stack")
    env = stack_env(tmp, f"redis://127.0.0.1:{free_port()}/0")
    env["LANNER_WEBHOOK_PRIVATE_TARGETS"] = "true"  # the browser tests' webhook receiver listens on localhost
    running = RunningStack(tmp / "data", env).wait_up()
    yield running
    running.stop()


@pytest.fixture
def llama_cpp_state(tmp_path, monkeypatch):
    """Sets how llama.cpp's build stands ("building" by this process, "failed", "ready"), in a state file
    of the test's own that lanner.inference.availability reads instead of the environment's."""
    from lanner.inference import availability

    monkeypatch.setattr(availability, "STATE_FILE", tmp_path / "llama-cpp-state")

    def write(state: str) -> None:
        availability.write_state(state, log=tmp_path / "llama-cpp-build.log", wanted="test")

    return write
