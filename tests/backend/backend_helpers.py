"""Helpers shared by the backend tests (fixtures live in conftest.py)."""
from __future__ import annotations

import os

from fastapi.testclient import TestClient

from lanner.core import db
from lanner.core.models import Job

# A Redis database of the backend tests' own: job ids restart at 1 in every test database, so job
# streams on the shared database 0 would mix with other suites' events.
_SYSTEM_REDIS_URL = os.environ.get("LANNER_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
BACKEND_REDIS_URL = _SYSTEM_REDIS_URL.rsplit("/", 1)[0] + "/11"
PASSWORD = "correct horse battery"
MODEL = "builtin/SmolLM2-135M-Instruct"

CHAT_ROWS = "\n".join(
    '{"messages": [{"role": "user", "content": "hi %d"}, {"role": "assistant", "content": "hello %d"}]}' % (i, i)
    for i in range(5)) + "\n"
PREFERENCE_ROWS = "\n".join(
    '{"prompt": "q%d", "chosen": "good", "rejected": "bad"}' % i for i in range(5)) + "\n"


def upload(client: TestClient, filename: str, content: bytes | str, **params):
    body = content.encode() if isinstance(content, str) else content
    return client.post("/api/datasets", params={"filename": filename, **params}, content=body,
                       headers={"content-type": "application/octet-stream"})




def submit(client: TestClient, dataset: int, **spec):
    return client.post("/api/jobs", json={"method": "lora", "model": MODEL, "dataset_id": dataset, **spec})


def set_status(api, job_id: int, status, **fields) -> None:
    """Puts a job in a state straight in the database, as a worker would have."""
    with db.session_factory(api.settings.database_url)() as session:
        job = session.get(Job, job_id)
        job.status = status
        for key, value in fields.items():
            setattr(job, key, value)
        session.commit()


def field_errors(response) -> dict:
    """A 422's messages by field (the location after "body")."""
    assert response.status_code == 422, response.text
    return {tuple(error["loc"][1:]): error["msg"] for error in response.json()["detail"]}
