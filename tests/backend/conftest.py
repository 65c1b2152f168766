"""The API in process (FastAPI's TestClient) on a real database and a real Redis: a team of an
admin and two members, each with their own signed-in client."""
from __future__ import annotations

import shutil
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from redis import Redis

from lanner.backend import security
from lanner.core import db
from lanner.backend.app import create_app
from lanner.core.settings import get_settings

from backend_helpers import BACKEND_REDIS_URL, PASSWORD



@pytest.fixture(autouse=True)
def fast_password_hashing(monkeypatch):
    monkeypatch.setattr(security, "SCRYPT_N", 2**10)


@pytest.fixture
def redis() -> Redis:
    client = Redis.from_url(BACKEND_REDIS_URL, decode_responses=True)
    client.flushdb()  # database 11 is the backend tests' alone (see backend_helpers)
    yield client
    client.close()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory):
    """Migrated once; each test copies the file instead of running Alembic again."""
    path = tmp_path_factory.mktemp("template") / "lanner.db"
    url = f"sqlite:///{path}"
    db.migrate(url)
    db.get_engine(url).dispose()
    return path


@dataclass
class Api:
    app: object
    settings: object
    redis: Redis

    def client(self) -> TestClient:
        return TestClient(self.app)

    def signed_in(self, email: str, password: str = PASSWORD) -> TestClient:
        client = self.client()
        response = client.post("/api/auth/sign-in", json={"email": email, "password": password})
        assert response.status_code == 200, response.text
        return client


def _make_api(url: str, tmp_path, monkeypatch, redis: Redis) -> Api:
    monkeypatch.setenv("LANNER_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("LANNER_DATABASE_URL", url)
    monkeypatch.setenv("LANNER_REDIS_URL", BACKEND_REDIS_URL)
    monkeypatch.setenv("LANNER_HUB_URL", "http://127.0.0.1:9")  # nothing listens on discard: offline
    monkeypatch.setenv("LANNER_HUB_TIMEOUT_S", "1")
    get_settings.cache_clear()
    settings = get_settings()
    settings.ensure_dirs()
    return Api(create_app(), settings, redis)


@pytest.fixture
def api(tmp_path, monkeypatch, redis, migrated_sqlite) -> Api:
    """On SQLite only: for what the database does not change."""
    path = tmp_path / "lanner.db"
    shutil.copy(migrated_sqlite, path)
    yield _make_api(f"sqlite:///{path}", tmp_path, monkeypatch, redis)
    db.get_engine(f"sqlite:///{path}").dispose()
    get_settings.cache_clear()


@pytest.fixture
def api_on_each_database(tmp_path, monkeypatch, redis, database_url, migrated_sqlite) -> Api:
    """On SQLite and on PostgreSQL."""
    if database_url.startswith("sqlite"):
        shutil.copy(migrated_sqlite, database_url.removeprefix("sqlite:///"))
    else:
        db.migrate(database_url)
    yield _make_api(database_url, tmp_path, monkeypatch, redis)
    db.get_engine(database_url).dispose()
    get_settings.cache_clear()


@dataclass
class Team:
    api: Api
    admin: TestClient
    alice: TestClient
    bob: TestClient
    anonymous: TestClient
    ids: dict

    def as_(self, who: str) -> TestClient:
        return getattr(self, who)


def make_team(api: Api) -> Team:
    admin = api.client()
    response = admin.post("/api/setup", json={"email": "ada@example.com", "display_name": "Ada", "password": PASSWORD})
    assert response.status_code == 201, response.text
    ids = {"admin": response.json()["id"]}
    for name in ("alice", "bob"):
        created = admin.post("/api/users", json={"email": f"{name}@example.com", "display_name": name.title(),
                                                 "password": PASSWORD})
        assert created.status_code == 201, created.text
        ids[name] = created.json()["id"]
    return Team(api, admin, api.signed_in("alice@example.com"), api.signed_in("bob@example.com"), api.client(), ids)


@pytest.fixture
def team(api) -> Team:
    return make_team(api)


@pytest.fixture
def team_on_each_database(api_on_each_database) -> Team:
    return make_team(api_on_each_database)


@pytest.fixture
def wakes(monkeypatch):
    """Records the worker wake-ups instead of sending them."""
    calls = []
    monkeypatch.setattr("lanner.core.queue.claim.wake_workers", lambda settings: calls.append(settings))
    return calls


@pytest.fixture
def team_with(api, monkeypatch):
    """A team on an API started with some settings changed: team_with(LANNER_X="1")."""
    def make(**environment: str) -> Team:
        for key, value in environment.items():
            monkeypatch.setenv(key, value)
        get_settings.cache_clear()
        api.app, api.settings = create_app(), get_settings()
        return make_team(api)

    return make


@pytest.fixture
def allowed_smollm2(api, monkeypatch, smollm2_dir):
    """The test cache's SmolLM2 checkpoint, in a folder the API allows local models from."""
    monkeypatch.setenv("LANNER_LOCAL_MODEL_DIRS", f"{api.settings.models_dir}:{smollm2_dir.parent}")
    get_settings.cache_clear()
    return smollm2_dir
