"""Property-based test of the whole API with schemathesis: generated requests, valid and not, to every
operation of the OpenAPI document, on the real app (SQLite and PostgreSQL, Redis), signed in as an
admin. No request may cause a 5xx, and every answer must be what the document says: a documented
status, content type, headers and body. Generated text includes NUL (which PostgreSQL refuses), and
some JSON bodies have their text replaced by NUL or a lone surrogate, or their numbers by NaN or
Infinity: what an outside probe sent (issue 24)."""
from __future__ import annotations

import json
import shutil

import pytest
import schemathesis
from hypothesis import strategies as st
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from redis import Redis
from schemathesis.checks import (content_type_conformance, not_a_server_error, response_headers_conformance,
                                 response_schema_conformance, status_code_conformance)
from schemathesis.config import SchemathesisConfig

from lanner.backend import security
from lanner.core import db
from lanner.backend.app import create_app
from lanner.core.models import Artifact, Job, JobStatus
from lanner.core.redis_client import get_redis
from lanner.backend.security import SESSION_COOKIE, open_session
from lanner.core.settings import get_settings

from backend_helpers import BACKEND_REDIS_URL, CHAT_ROWS, PASSWORD, upload
from support import fresh_postgres_database


@schemathesis.check
def no_server_error_but_offline(ctx, response, case):
    """No 5xx, except the hub routes' documented 503 "offline: …" (this machine has no hub)."""
    if response.status_code == 503 and str(response.json().get("detail", "")).startswith("offline:"):
        return None
    return not_a_server_error(ctx, response, case)


CHECKS = [no_server_error_but_offline, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]
EXAMPLES_PER_OPERATION = 10  # bounded, so the run stays within seconds per operation
HOSTILE_TEXT = ("a\x00b", "\ud800")
HOSTILE_NUMBERS = (float("nan"), float("inf"), float("-inf"))


def _replaced(value, text=None, number=None):
    """`value` with every string (keys included) or every number replaced."""
    if isinstance(value, dict):
        return {_replaced(key, text, number): _replaced(item, text, number) for key, item in value.items()}
    if isinstance(value, list):
        return [_replaced(item, text, number) for item in value]
    if isinstance(value, str) and text is not None:
        return text
    if isinstance(value, (int, float)) and not isinstance(value, bool) and number is not None:
        return number
    return value


def _hostile_bodies(body) -> list:
    """A JSON body as generated, and as bytes with its text or numbers made hostile: json.dumps writes
    NaN and Infinity as Python's parser reads them, and NUL and surrogates as \\u escapes."""
    if not isinstance(body, (dict, list)):
        return [body]
    variants = [_replaced(body, text=text) for text in HOSTILE_TEXT] + \
               [_replaced(body, number=number) for number in HOSTILE_NUMBERS]
    return [body, *(json.dumps(variant).encode() for variant in variants)]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database(request, tmp_path_factory, migrated_sqlite):
    if request.param == "sqlite":
        path = tmp_path_factory.mktemp("fuzz-db") / "lanner.db"
        shutil.copy(migrated_sqlite, path)
        yield f"sqlite:///{path}"
        return
    with fresh_postgres_database() as url:
        db.migrate(url)
        yield url
        db.get_engine(url).dispose()


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory, database):
    """One team for the whole run (a fresh one per operation would cost more than the requests): a
    dataset, a finished job with an artifact and a queued job, at the small ids generated requests
    hit often; rate limits out of the way; worker wake-ups not sent."""
    tmp = tmp_path_factory.mktemp("fuzz")
    Redis.from_url(BACKEND_REDIS_URL).flushdb()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(security, "SCRYPT_N", 2**10)
        patch.setattr("lanner.core.queue.claim.wake_workers", lambda settings: None)
        environment = {"DATA_DIR": str(tmp / "data"), "DATABASE_URL": database,
                       "REDIS_URL": BACKEND_REDIS_URL, "HUB_URL": "http://127.0.0.1:9", "HUB_TIMEOUT_S": "1",
                       **{f"{kind}_PER_MINUTE": "1000000" for kind in
                          ("REQUESTS", "UPLOADS", "JOBS", "HUB_REQUESTS", "PREVIEWS", "SIGN_INS")}}
        for key, value in environment.items():
            patch.setenv(f"LANNER_{key}", value)
        get_settings.cache_clear()
        app = create_app()
        admin = TestClient(app)
        assert admin.post("/api/setup", json={"email": "ada@example.com", "display_name": "Ada",
                                              "password": PASSWORD}).status_code == 201
        dataset_id = upload(admin, "chat.jsonl", CHAT_ROWS).json()["id"]
        spec = {"method": "lora", "model": "builtin/SmolLM2-135M-Instruct", "dataset_id": dataset_id}
        done, _ = (admin.post("/api/jobs", json=spec).json()["id"] for _ in range(2))
        settings = get_settings()
        with db.session_factory(settings.database_url)() as session:
            session.get(Job, done).status = JobStatus.succeeded
            folder = settings.artifacts_dir / str(done)
            folder.mkdir(parents=True)
            (folder / "model.gguf").write_bytes(b"GGUF" + bytes(100))
            session.add(Artifact(job_id=done, kind="gguf", name="model.gguf", path=f"artifacts/{done}/model.gguf",
                                 size_bytes=104))
            session.commit()
        yield app, admin.get("/api/me").json()["id"]
        db.get_engine(settings.database_url).dispose()
    get_settings.cache_clear()


def _openapi_document() -> dict:
    document = create_app().openapi()  # the document does not depend on the settings
    get_settings.cache_clear()
    return document


# Generated from the document; sent to each test's own app (and database) with call(app=…).
# The coverage phase's requests with methods a path does not have are left out: Starlette's 405s.
schema = schemathesis.openapi.from_dict(_openapi_document(), config=SchemathesisConfig.from_dict(
    {"phases": {"coverage": {"unexpected-methods": []}}, "generation": {"allow-x00": True}}))


@schema.hook
def flatmap_body(context, body):
    return st.sampled_from(_hostile_bodies(body))


@schema.parametrize()
@settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented_and_never_fails(case, fuzzed):
    # A fresh admin session for each request: a generated sign-out must not end the run's session.
    app, admin_id = fuzzed
    session = open_session(get_redis(BACKEND_REDIS_URL), admin_id, 1)
    case.call_and_validate(app=app, headers={"Cookie": f"{SESSION_COOKIE}={session}"}, checks=CHECKS)
