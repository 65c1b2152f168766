"""`lanner worker`: a worker host that needs only the database URL and the Redis URL. It says in
words what it cannot reach, refuses a worker name another live host holds, and drains on SIGTERM."""
from __future__ import annotations

import signal
import subprocess
import time

from redis import Redis

from lanner.core import db
from lanner.core.worker_registry import live_workers

from support import LANNER_BIN, REPO, WORKER_REDIS_URL, free_port, stack_env


def worker_host(env: dict) -> subprocess.Popen:
    return subprocess.Popen([LANNER_BIN, "worker"], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_a_worker_host_says_what_it_cannot_reach(tmp_path):
    env = stack_env(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    env["LANNER_DATABASE_URL"] = f"postgresql+psycopg://lanner@127.0.0.1:{free_port()}/lanner"
    result = subprocess.run([LANNER_BIN, "worker"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "lanner worker: cannot start." in result.stderr, result.stderr
    assert "The database at postgresql+psycopg://lanner@127.0.0.1" in result.stderr
    assert "cannot connect" in result.stderr and "Redis does not answer at redis://127.0.0.1:" in result.stderr

    stale = f"sqlite:///{tmp_path / 'old.db'}"  # reachable, but its schema is behind this Lanner's
    db.migrate(stale, "0006")
    env.update(LANNER_DATABASE_URL=stale, LANNER_REDIS_URL=WORKER_REDIS_URL)
    result = subprocess.run([LANNER_BIN, "worker"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "schema at 0006, expected" in result.stderr, result.stderr
    assert "Redis" not in result.stderr  # Redis answers: only the database is named


def test_a_worker_host_starts_refuses_a_duplicate_host_name_and_drains_on_sigterm(tmp_path):
    redis = Redis.from_url(WORKER_REDIS_URL, decode_responses=True)
    redis.flushdb()
    env = stack_env(tmp_path, WORKER_REDIS_URL)
    env.update(LANNER_DATABASE_URL=f"sqlite:///{tmp_path / 'lanner.db'}", LANNER_HOST_NAME="box-a",
               CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    db.migrate(env["LANNER_DATABASE_URL"])
    host = worker_host(env)
    try:
        deadline = time.monotonic() + 90
        while not live_workers(redis) and time.monotonic() < deadline and host.poll() is None:
            time.sleep(0.3)
        [record] = live_workers(redis)
        assert (record.name, record.host, record.device.host) == ("cpu0@box-a", "box-a", "box-a")

        twin = subprocess.run([LANNER_BIN, "worker"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert twin.returncode != 0
        assert "A worker named cpu0@box-a is already running on host box-a" in twin.stdout + twin.stderr
        assert "LANNER_HOST_NAME" in twin.stdout + twin.stderr
        assert [record.instance for record in live_workers(redis)] == [record.instance]  # the first one kept

        host.send_signal(signal.SIGTERM)
        output, _ = host.communicate(timeout=60)
        assert host.returncode == 0, output
        assert "Draining worker host box-a" in output and "Worker host box-a stopped." in output
        assert live_workers(redis) == []  # it retired its worker
    finally:
        if host.poll() is None:
            host.kill()
            host.communicate()
        redis.flushdb()
