"""`lanner up` brings up the real parts (API, a Celery worker process, Redis) and stops only them."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import psutil
import pytest
from redis import Redis

from support import LANNER_BIN, SYSTEM_REDIS_URL, RunningStack, free_port, stack_env


def test_health_reports_database_redis_and_a_cpu_worker(stack):
    health = stack.health()
    assert health["status"] == "ok", health
    assert health["database"]["ok"] and health["database"]["url"].startswith("sqlite:///")
    assert health["redis"]["ok"]
    assert [worker["name"].split("@")[0] for worker in health["workers"]] == ["cpu0"]
    device = health["workers"][0]["device"]
    assert device["kind"] == "cpu" and device["memory_total_bytes"] > 2**30


def test_a_second_up_on_the_same_port_changes_nothing(stack):
    second = subprocess.run([LANNER_BIN, "up"], env=stack.env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert "already running" in second.stdout
    assert stack.process.poll() is None
    assert stack.health()["status"] == "ok"


def celery_children(pid: int) -> list[psutil.Process]:
    found = []
    for child in psutil.Process(pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "celery" in " ".join(child.cmdline()):
                found.append(child)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass  # a worker that just died and is not reaped yet
    return found


def test_a_killed_worker_is_started_again(stack):
    worker = celery_children(stack.process.pid)[0]
    killed_at = datetime.now(timezone.utc)
    worker.kill()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        pids = {p.pid for p in celery_children(stack.process.pid)}
        announced = [datetime.fromisoformat(w["last_seen"]) for w in stack.health()["workers"]]
        if pids and worker.pid not in pids and announced and announced[0] > killed_at:
            break
        time.sleep(1)
    else:
        pytest.fail("the worker was not restarted:\n" + "".join(stack.output))
    assert "starting it again" in "".join(stack.output)


def test_ctrl_c_stops_what_up_started_and_nothing_else(tmp_path):
    system_redis = Redis.from_url(SYSTEM_REDIS_URL)
    assert system_redis.ping(), "the machine's Redis must be running for this test"
    # Use the machine's Redis (db 13): up must not start a second one, and must leave it running.
    running = RunningStack(tmp_path / "data", stack_env(tmp_path, SYSTEM_REDIS_URL.rsplit("/", 1)[0] + "/13")).wait_up()
    assert "Redis: using" in "".join(running.output)
    children = psutil.Process(running.process.pid).children(recursive=True)
    assert {"api", "celery"} <= {("celery" if "celery" in " ".join(c.cmdline()) else "api") for c in children}
    assert running.stop(signal.SIGINT) == 0
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]
    assert system_redis.ping()
    assert not Redis.from_url(SYSTEM_REDIS_URL.rsplit("/", 1)[0] + "/13").keys("lanner:worker:*")


def test_up_imports_the_builtin_model_in_the_background(stack):
    from lanner.core.default_model import is_imported

    assert "The built-in model is being imported in the background" in "".join(stack.output)
    deadline = time.monotonic() + 300
    while not is_imported(stack.data_dir / "models") and time.monotonic() < deadline:
        time.sleep(1)
    assert is_imported(stack.data_dir / "models"), "".join(stack.output)
    while "The built-in model is imported." not in "".join(stack.output) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "The built-in model is imported." in "".join(stack.output)


def test_the_api_alone_reaps_its_builtin_import_child(tmp_path):
    api = subprocess.Popen([LANNER_BIN, "api"], env=stack_env(tmp_path, f"redis://127.0.0.1:{free_port()}/0"),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        importers = []
        while not importers and time.monotonic() < deadline:
            importers = [c for c in psutil.Process(api.pid).children()
                         if "import-default-model" in " ".join(c.cmdline())]
            time.sleep(0.2)
        assert importers, "lanner api started no import of the built-in model"
        importers[0].kill()  # ends at once, as a finished import would: the API must reap it
        deadline = time.monotonic() + 10
        while psutil.pid_exists(importers[0].pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not psutil.pid_exists(importers[0].pid), "the import child is left a zombie of the API process"
    finally:
        api.terminate()
        api.wait(20)


def test_up_starts_a_local_redis_and_stops_it(stack):
    port = int(stack.env["LANNER_REDIS_URL"].rsplit(":", 1)[1].split("/")[0])
    assert "starting a local redis-server" in "".join(stack.output)
    assert Redis(port=port).ping()


def test_without_redis_server_up_says_what_to_install(tmp_path):
    env = stack_env(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    env["PATH"] = os.path.dirname(sys.executable)  # no redis-server and no apt-get on this PATH
    result = subprocess.run([LANNER_BIN, "up"], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    message = result.stderr.strip().splitlines()[-1]
    assert "Lanner needs Redis" in message and "install" in message
    assert "Traceback" not in result.stderr


def test_worker_replicas_claim_distinct_gpus():
    from lanner.core.worker_registry import GPU_CLAIM_PREFIX, claim_gpu

    redis = Redis.from_url(SYSTEM_REDIS_URL.rsplit("/", 1)[0] + "/14")
    uuids = [f"GPU-test-{i}-{os.getpid()}" for i in range(2)]
    try:
        assert claim_gpu(redis, uuids, "a") == uuids[0]
        assert claim_gpu(redis, uuids, "b") == uuids[1]
        assert claim_gpu(redis, uuids, "c") is None
        redis.delete(GPU_CLAIM_PREFIX + uuids[0])  # its worker died and the claim expired
        assert claim_gpu(redis, uuids, "d") == uuids[0]
    finally:
        redis.delete(*(GPU_CLAIM_PREFIX + u for u in uuids))


def test_one_cpu_worker_without_gpus_and_cuda_visible_devices_is_respected(monkeypatch):
    from lanner.cli import stack as stack_module

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    if stack_module.gpu_count() == 0:
        assert stack_module.worker_envs() == [("cpu0", {"CUDA_VISIBLE_DEVICES": ""})]
    else:
        assert [name for name, _ in stack_module.worker_envs()][0] == "gpu0"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5")
    assert stack_module.visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert stack_module.visible_gpus() == []


def test_the_redis_up_started_is_started_again_when_it_stops(tmp_path):
    from lanner.cli.redis_server import answers
    from lanner.cli.stack import REDIS_CHILD, Stack
    from lanner.core.settings import Settings

    settings = Settings(data_dir=tmp_path, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    settings.ensure_dirs()
    stack = Stack(settings)
    try:
        stack._start_redis()
        Redis.from_url(settings.redis_url).set("kept", "1")
        [redis] = stack.children
        os.kill(redis.process.pid, signal.SIGTERM)  # saves its snapshot, as a stopped Redis does
        redis.process.wait(10)
        stack.check_children(restart_workers=True)
        assert answers(settings.redis_url) and [child.name for child in stack.children] == [REDIS_CHILD]
        assert Redis.from_url(settings.redis_url).get("kept") == b"1"
    finally:
        stack.stop()
