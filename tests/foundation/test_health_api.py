"""The API's own answers, in process: health when parts are down, and the single-page app's files."""
from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from lanner.core import db
from lanner.backend.app import create_app
from lanner.core.settings import get_settings

from support import free_port


@pytest.fixture
def client_for(tmp_path, monkeypatch):
    def make(database_url: str, redis_url: str, frontend_dir=None) -> TestClient:
        monkeypatch.setenv("LANNER_DATA_DIR", str(tmp_path / "data"))
        monkeypatch.setenv("LANNER_DATABASE_URL", database_url)
        monkeypatch.setenv("LANNER_REDIS_URL", redis_url)
        if frontend_dir:
            monkeypatch.setenv("LANNER_FRONTEND_DIR", str(frontend_dir))
        get_settings.cache_clear()
        return TestClient(create_app())

    yield make
    get_settings.cache_clear()


def test_health_says_which_part_is_down(client_for, database_url):
    client = client_for(database_url, f"redis://127.0.0.1:{free_port()}/0")
    before = client.get("/api/health").json()
    assert before["status"] == "degraded"
    assert not before["database"]["ok"] and "lanner migrate" in before["database"]["detail"]
    assert not before["redis"]["ok"] and "cannot connect" in before["redis"]["detail"]
    db.migrate(database_url)
    after = client.get("/api/health").json()
    assert after["database"]["ok"], after["database"]
    assert after["status"] == "degraded" and after["workers"] == []


def test_health_hides_database_passwords(client_for):
    client = client_for("postgresql+psycopg://lanner:s3cret@127.0.0.1:1/lanner", "redis://:pw@127.0.0.1:1/0")
    body = client.get("/api/health").json()
    assert "s3cret" not in str(body) and not body["database"]["ok"]


def test_the_frontend_is_served_with_a_fallback_for_client_routes(client_for, tmp_path):
    dist = tmp_path / "dist"
    (dist / "assets").mkdir(parents=True)
    (dist / "index.html").write_text("<div id=root></div>")
    (dist / "assets" / "app.js").write_text("console.log(1)")
    (tmp_path / "secret.txt").write_text("not for the browser")
    client = client_for(f"sqlite:///{tmp_path / 'x.db'}", "redis://127.0.0.1:1/0", dist)
    assert client.get("/").text == "<div id=root></div>"
    assert client.get("/jobs/42").text == "<div id=root></div>"
    assert client.get("/assets/app.js").text == "console.log(1)"
    assert "not for the browser" not in client.get("/..%2Fsecret.txt").text
    missing = client.get("/api/no-such-thing")
    assert missing.status_code == 404 and "No such endpoint" in missing.json()["detail"]


def test_without_a_built_frontend_the_page_says_how_to_build_it(client_for, tmp_path):
    client = client_for(f"sqlite:///{tmp_path / 'x.db'}", "redis://127.0.0.1:1/0", tmp_path / "nothing")
    response = client.get("/")
    assert response.status_code == 503 and "./lanner up" in response.text
