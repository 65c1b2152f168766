"""What a second outside probe broke (after issue 24's): each answer is a 4xx in words, never a 500, a
dropped socket, a second write over a worker's claim, or a small file that takes the API's memory."""
from __future__ import annotations

import threading

import pytest
from sqlalchemy import delete, update

from lanner.backend.paths import safe_filename
from lanner.backend.services import accounts, jobs
from lanner.core import db
from lanner.core.dataset_formats import DatasetError, inspect_dataset
from lanner.core.errors import UserError
from lanner.core.models import Dataset, Job, JobStatus, Role, User
from lanner.core.rewards.builtin import json_schema_check
from lanner.core.spec_files import SpecFileError, load_yaml

from backend_helpers import CHAT_ROWS, PASSWORD, submit, upload


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
def test_a_body_that_is_not_utf8_is_a_422_in_words(team, content_type):
    # FastAPI echoes a body it could not read as JSON as bytes, which its own handler cannot encode
    response = team.alice.post("/api/tokens", content=b'{"name": "caf\xe9"}', headers={"content-type": content_type})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body"]


def test_a_user_created_twice_at_once_is_a_409(team, monkeypatch):
    hashed = accounts.hash_password

    def another_request_meanwhile(password: str) -> str:  # creates the email between the check and the insert
        with db.session_factory(team.api.settings.database_url)() as other:
            other.add(User(email="twice@example.com", display_name="Twice", role=Role.member,
                           password_hash=hashed(password)))
            other.commit()
        return hashed(password)

    monkeypatch.setattr(accounts, "hash_password", another_request_meanwhile)
    response = team.admin.post("/api/users", json={"email": "twice@example.com", "display_name": "Twice",
                                                   "password": PASSWORD})
    assert response.status_code == 409 and "exists already" in response.json()["detail"]


def test_a_row_deleted_under_a_request_is_a_409_not_a_500(team, wakes, monkeypatch):
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]

    def dataset_deleted_meanwhile(*args, **kwargs):
        with db.session_factory(team.api.settings.database_url)() as other:
            other.execute(delete(Dataset).where(Dataset.id == dataset))
            other.commit()
        return None

    monkeypatch.setattr(jobs, "memory_estimate", dataset_deleted_meanwhile)
    response = submit(team.alice, dataset)
    assert response.status_code == 409 and "at the same moment" in response.json()["detail"]


@pytest.mark.parametrize("verb", ["cancel", "delete"])
def test_a_job_a_worker_claims_meanwhile_is_neither_cancelled_nor_deleted_under_it(team, wakes, monkeypatch, verb):
    from lanner.backend.routers import jobs as jobs_router

    job = submit(team.alice, upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]).json()["id"]
    checked = jobs_router.require_owner_or_admin

    def claimed_meanwhile(*args):  # the worker's claim lands between the request's read and its write
        checked(*args)
        with db.session_factory(team.api.settings.database_url)() as other:
            other.execute(update(Job).where(Job.id == job).values(status=JobStatus.running, worker="cpu0@probe"))
            other.commit()

    monkeypatch.setattr(jobs_router, "require_owner_or_admin", claimed_meanwhile)
    if verb == "cancel":
        response = team.alice.post(f"/api/jobs/{job}/cancel")
        assert response.status_code == 202 and response.json()["cancel_requested"], response.text
        assert team.api.redis.get(f"lanner:job:{job}:cancel") == "1"  # the worker is asked to stop it
    else:
        response = team.alice.delete(f"/api/jobs/{job}")
        assert response.status_code == 409 and "running" in response.json()["detail"]
    assert team.alice.get(f"/api/jobs/{job}").json()["status"] == "running"


def test_a_job_deleted_twice_is_deleted_once(team, wakes):
    job = submit(team.alice, upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]).json()["id"]
    with db.session_factory(team.api.settings.database_url)() as session:
        row = session.get(Job, job)  # read by both requests before either deletes
        with db.session_factory(team.api.settings.database_url)() as other:
            jobs.delete(other, team.api.redis, team.api.settings, other.get(Job, job))
        with pytest.raises(UserError, match=f"No job {job}"):
            jobs.delete(session, team.api.redis, team.api.settings, row)


def test_a_path_no_file_system_holds_is_the_web_app_not_a_500(team):
    response = team.anonymous.get("/" + "a" * 5000)
    assert response.status_code in (200, 503) and "Internal" not in response.text


@pytest.mark.parametrize("text, words", [('name: "\\ud800"', "lone surrogate"), ('name: "a\\0b"', "NUL"),
                                         ("seed: " + "9" * 5000, "cannot be read")])
def test_yaml_no_answer_can_carry_is_refused_in_words(team, text, words):
    response = team.alice.post("/api/jobs/config/parse", json={"text": f"method: lora\n{text}"})
    assert response.status_code == 422 and words in response.json()["detail"]
    with pytest.raises(SpecFileError, match="^The file holds more than"):  # its own refusals keep their words
        load_yaml("a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
            f"{c}: &{c} [{', '.join(['*' + p] * 10)}]\n" for p, c in zip("abcd", "bcde")))


@pytest.mark.parametrize("frame", ["[" * 100_000 + "]" * 100_000, b"\xff\xfe binary"])
def test_the_playground_answers_any_frame_in_words(team, frame):
    answers = []

    def talk():  # in a thread: a socket the server dropped without a close would leave the test waiting
        with team.alice.websocket_connect("/ws/playground") as socket:
            socket.send_bytes(frame) if isinstance(frame, bytes) else socket.send_text(frame)
            answers.append(socket.receive_json())

    talking = threading.Thread(target=talk, daemon=True)
    talking.start()
    talking.join(timeout=10)
    assert answers and answers[0]["type"] == "error" and answers[0]["code"] == "bad_request"


def test_a_name_in_another_script_keeps_its_extension(team):
    assert safe_filename("数据.jsonl", default="dataset") == "dataset.jsonl"
    assert safe_filename("../../.hidden.csv") == "hidden.csv" and safe_filename("...") == "file"
    response = upload(team.alice, "训练数据.jsonl", CHAT_ROWS)
    assert response.status_code == 201 and response.json()["filename"] == "dataset.jsonl"


def parquet_file(path, rows: int, value: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    repeated = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([value]))
    pq.write_table(pa.table({"prompt": repeated, "completion": repeated}), path, compression="zstd")
    return path


@pytest.mark.parametrize("rows, value", [(2_000_000, "hello"), (1_000, "x" * 1_000_000)])
def test_a_parquet_decompression_bomb_is_refused_before_it_is_read(tmp_path, rows, value):
    bomb = parquet_file(tmp_path / "bomb.parquet", rows, value)  # a few KB: millions of rows, or a GB of text
    with pytest.raises(DatasetError, match="decompression bomb"):
        inspect_dataset(bomb)
    assert inspect_dataset(parquet_file(tmp_path / "fine.parquet", 3, "hello"))["usable_rows"] == 3


def test_a_completion_nested_deeper_than_a_parser_follows_is_not_json():
    assert json_schema_check("[" * 100_000 + "]" * 100_000, {"type": "array"}) == 0.0


def test_an_unexpected_error_says_the_connection_closes(api, monkeypatch):
    from fastapi.testclient import TestClient

    def broken(session):
        raise RuntimeError("a bug")

    monkeypatch.setattr(accounts, "has_users", broken)
    response = TestClient(api.app, raise_server_exceptions=False).get("/api/setup")
    assert response.status_code == 500 and response.headers["connection"] == "close"
    assert "a bug" not in response.text


def test_head_answers_every_get_route_with_its_headers_alone(team):
    get, head = team.alice.get("/api/health"), team.alice.head("/api/health")
    assert head.status_code == get.status_code == 200 and head.content == b""
    assert (head.headers["content-type"], head.headers["content-length"]) == (
        get.headers["content-type"], get.headers["content-length"])
    assert team.alice.head("/api/jobs").status_code == 200
    assert team.anonymous.head("/api/jobs").status_code == 401
    assert team.alice.head("/").status_code == team.alice.get("/").status_code != 405  # the web UI's page
    assert team.alice.head("/api/no-such-route").status_code == 404


def test_an_upload_the_client_drops_is_no_error_and_leaves_nothing(team, caplog):
    import asyncio

    token = team.alice.post("/api/tokens", json={"name": "script"}).json()["token"]
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "server": ("testserver", 80), "client": ("127.0.0.1", 1),
             "root_path": "", "path": "/api/datasets", "raw_path": b"/api/datasets", "query_string": b"filename=a.jsonl",
             "headers": [(b"host", b"testserver"), (b"authorization", f"Bearer {token}".encode()),
                         (b"content-length", b"100000"), (b"content-type", b"application/octet-stream")]}
    messages = iter([{"type": "http.request", "body": b'{"messages": [', "more_body": True}, {"type": "http.disconnect"}])
    sent = []

    async def receive():
        return next(messages)

    async def send(message):
        sent.append(message)

    with caplog.at_level("INFO"):
        asyncio.run(team.api.app(scope, receive, send))
    assert not [record for record in caplog.records if record.levelname in ("ERROR", "CRITICAL")]
    assert "the client closed the connection" in caplog.text
    assert not list((team.api.settings.datasets_dir / ".incoming").iterdir())
