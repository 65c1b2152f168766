"""Helpers shared by the playground tests (fixtures are in conftest.py)."""
from __future__ import annotations

import json
import os

from support import process_env

SYSTEM_REDIS_URL = os.environ.get("LANNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# A Redis database of the playground tests' own (backend 11, worker 15; 12-14 are used elsewhere).
PLAYGROUND_REDIS_URL = SYSTEM_REDIS_URL.rsplit("/", 1)[0] + "/9"
# A question SmolLM2 answers at length (to max_tokens at temperature 0), for tests that act while an
# answer streams; it answers "Count from 1 to 300" in 9 tokens, which can end before a stop arrives.
LONG_QUESTION = "Write a long story about a cat who travels the world."


def qa_rows(count: int) -> list[dict]:
    return [{"instruction": f"What is {i} plus {i}?", "output": f"{i} plus {i} is {2 * i}."} for i in range(count)]


def receive_until_done(ws, sides: set[str], timeout: float = 120) -> list[dict]:
    """Every message of one request, until each side has sent its `done` or `error`."""
    messages, open_sides = [], set(sides)
    while open_sides:
        message = json.loads(ws.recv(timeout=timeout))
        messages.append(message)
        if message["type"] in ("done", "error"):
            open_sides.discard(message["model"])
            if message["model"] is None:
                break
    return messages


def answer(messages: list[dict], side: str) -> str:
    return "".join(m["text"] for m in messages if m["type"] == "token" and m["model"] == side)



def celery_worker(studio, name: str = "cpu0"):
    """A real Celery worker process on the studio, on the CPU: tests/worker's CeleryWorker (loaded from
    its file, since that folder is not on the path here), given the settings and Redis it reads."""
    import importlib.util
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    from redis import Redis

    spec = importlib.util.spec_from_file_location(
        "lanner_worker_test_helpers", Path(__file__).resolve().parents[1] / "worker" / "worker_helpers.py")
    helpers = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(helpers)
    env = process_env()
    env.update(studio.env(), CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    shim = SimpleNamespace(data_dir=studio.data_dir, env=env, redis=Redis.from_url(PLAYGROUND_REDIS_URL,
                                                                                    decode_responses=True))
    return helpers.CeleryWorker(shim, name).wait_ready()
