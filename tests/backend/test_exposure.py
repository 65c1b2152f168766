"""What the studio shows to whom (issue 24): security headers on every answer, an anonymous health
check without paths, host or device names, and a sign-in lockout per client and account."""
from __future__ import annotations

from fastapi.testclient import TestClient

from backend_helpers import PASSWORD


def test_every_answer_forbids_sniffing_and_framing(team):
    for response in (team.anonymous.get("/api/health"), team.anonymous.get("/api/me"), team.alice.get("/api/jobs"),
                     team.alice.post("/api/jobs", content=b'{"x": NaN}', headers={"content-type": "application/json"})):
        assert response.headers["x-content-type-options"] == "nosniff"
        assert "frame-ancestors 'none'" in response.headers["content-security-policy"]


def test_anonymous_health_shows_no_paths_hosts_or_device_names(team):
    from lanner.core.messages.device import Device
    from lanner.core.worker_registry import announce_worker

    announce_worker(team.api.redis, "cpu0@secret-host",
                    Device(kind="cpu", name="Secret CPU 9000", memory_total_bytes=2**34, host="secret-host"))
    anonymous = team.anonymous.get("/api/health").json()
    signed_in = team.alice.get("/api/health").json()
    database_file = team.api.settings.database_url.removeprefix("sqlite:///")
    assert database_file in signed_in["database"]["url"]
    assert "secret-host" in str(signed_in) and "Secret CPU" in str(signed_in)
    for hidden in (database_file, "lanner.db", "127.0.0.1", "secret-host", "Secret CPU"):
        assert hidden not in str(anonymous), hidden
    assert anonymous["status"] == signed_in["status"] and anonymous["database"]["ok"]
    assert anonymous["workers"][0]["name"] == "cpu0" and anonymous["workers"][0]["device"]["memory_total_bytes"] == 2**34


def test_health_says_how_llama_cpp_stands_and_only_a_signed_in_user_sees_the_log(team, llama_cpp_state):
    assert team.alice.get("/api/health").json()["llama_cpp"]["state"] == "ready"  # no state file: the package
    llama_cpp_state("building")
    building = team.alice.get("/api/health").json()
    assert building["llama_cpp"]["state"] == "building" and building["llama_cpp"]["since"]
    assert building["llama_cpp"]["log"].endswith("llama-cpp-build.log")
    anonymous = team.anonymous.get("/api/health").json()["llama_cpp"]
    assert anonymous["state"] == "building" and anonymous["log"] is None


def test_wrong_passwords_from_one_client_do_not_lock_the_owner_out_elsewhere(team):
    stranger = TestClient(team.api.app, client=("203.0.113.7", 40000))
    for _ in range(10):
        assert stranger.post("/api/auth/sign-in", json={"email": "bob@example.com", "password": "guess"}).status_code == 401
    assert stranger.post("/api/auth/sign-in", json={"email": "bob@example.com", "password": PASSWORD}).status_code == 429
    owner = TestClient(team.api.app, client=("198.51.100.9", 40000))
    assert owner.post("/api/auth/sign-in", json={"email": "bob@example.com", "password": PASSWORD}).status_code == 200


def test_while_redis_is_away_a_cookie_request_is_a_503_in_words(team, monkeypatch):
    from lanner.backend.app import create_app
    from lanner.backend.errors import REDIS_AWAY
    from lanner.core.settings import get_settings

    from support import free_port

    monkeypatch.setenv("LANNER_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    get_settings.cache_clear()
    browser = TestClient(create_app(), cookies=dict(team.alice.cookies))
    response = browser.get("/api/me")
    assert response.status_code == 503 and response.json()["detail"] == REDIS_AWAY
    assert response.headers["retry-after"] == "5"


def test_health_lists_the_workers_by_host_with_the_host_to_a_signed_in_user_only(team):
    from lanner.core.messages.device import Device
    from lanner.core.worker_registry import announce_worker

    for name in ("gpu1@box-b", "gpu0@box-a", "gpu0@box-b", "gpu1@box-a"):
        host = name.split("@")[1]
        announce_worker(team.api.redis, name, Device(kind="cuda", name="H200", memory_total_bytes=2**37, host=host),
                        instance=f"instance-of-{name}")
    workers = team.alice.get("/api/health").json()["workers"]
    assert [(worker["host"], worker["name"]) for worker in workers] == [
        ("box-a", "gpu0@box-a"), ("box-a", "gpu1@box-a"), ("box-b", "gpu0@box-b"), ("box-b", "gpu1@box-b")]
    assert workers[0]["instance"] == "instance-of-gpu0@box-a"
    anonymous = team.anonymous.get("/api/health").json()["workers"]
    assert {(worker["host"], worker["instance"]) for worker in anonymous} == {(None, None)}
