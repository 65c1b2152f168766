"""Dataset uploads: streamed to disk, limited, checked; nothing half-uploaded is left behind."""
from __future__ import annotations

import io
import json
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from backend_helpers import CHAT_ROWS, PREFERENCE_ROWS, upload


def _parquet_bytes() -> bytes:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), buffer)
    return buffer.getvalue()


def leftovers(api) -> list:
    incoming = api.settings.datasets_dir / ".incoming"
    return list(incoming.iterdir()) if incoming.exists() else []


def test_upload_stores_the_file_and_its_report(team_on_each_database):
    team = team_on_each_database
    content = CHAT_ROWS + "not json\n"
    response = upload(team.alice, "my chats.jsonl", content, name="Chats")
    assert response.status_code == 201, response.text
    dataset = response.json()
    assert dataset["name"] == "Chats" and dataset["filename"] == "my_chats.jsonl"
    assert dataset["format"] == "messages" and dataset["rows"] == 6 and dataset["usable_rows"] == 5
    assert dataset["report"]["bad_rows"][0]["line"] == 6 and dataset["size_bytes"] == len(content)
    stored = team.api.settings.datasets_dir / str(dataset["id"]) / "my_chats.jsonl"
    assert stored.read_text() == content and leftovers(team.api) == []
    assert team.bob.get(f"/api/datasets/{dataset['id']}").json()["id"] == dataset["id"]
    listed = team.bob.get("/api/datasets").json()
    assert listed["total"] == 1 and team.bob.get("/api/datasets", params={"mine": True}).json()["total"] == 0
    assert team.alice.get("/api/datasets/usage").json()["used_bytes"] == len(content)


def test_csv_json_and_parquet_uploads(team):
    csv = "prompt,chosen,rejected\nq1,good,bad\nq2,good,bad\n"
    assert upload(team.alice, "pairs.csv", csv).json()["format"] == "preference"
    assert upload(team.alice, "rows.json", '[{"text": "a"}, {"text": "b"}]').json()["usable_rows"] == 2
    buffer = io.BytesIO()
    pq.write_table(pa.table({"instruction": ["a", "b", "c"], "output": ["x", "y", "z"]}), buffer)
    parquet = upload(team.alice, "alpaca.parquet", buffer.getvalue())
    assert parquet.status_code == 201 and parquet.json()["format"] == "alpaca" and parquet.json()["rows"] == 3


@pytest.mark.parametrize("filename, content, status, words", [
    ("empty.jsonl", b"", 422, "empty"),
    ("garbage.jsonl", b"{{{{\nnot json at all\n", 422, ""),
    ("latin1.jsonl", '{"text": "caf\u00e9"}\n'.encode("latin-1"), 422, ""),
    ("binary.parquet", b"PAR1 this is not parquet", 422, ""),
    ("truncated.parquet", _parquet_bytes()[:-40], 422, ""),
    ("utf16le.jsonl", '{"text": "hello"}\n'.encode("utf-16-le"), 422, ""),  # no BOM to tell it apart
    ("header-only.csv", b"text,label\n", 422, ""),
    ("whitespace.jsonl", b"\n\n   \n", 422, ""),
    ("unknown.jsonl", b'{"foo": 1}\n{"foo": 2}\n', 422, "format"),
    ("notes.txt", b"hello", 415, ".jsonl"),
    ("noext", b"hello", 415, ".jsonl"),
])
def test_malformed_and_unsupported_uploads_are_refused_and_leave_nothing(team, filename, content, status, words):
    response = upload(team.alice, filename, content)
    assert response.status_code == status, response.text
    assert words in response.json()["detail"]
    assert team.alice.get("/api/datasets").json()["total"] == 0
    folder = team.api.settings.datasets_dir
    assert leftovers(team.api) == [] and (not folder.exists() or [p.name for p in folder.iterdir()] == [".incoming"])


def test_path_like_filenames_are_flattened(team):
    dataset = upload(team.alice, "../../etc/evil.jsonl", CHAT_ROWS).json()
    assert dataset["filename"] == "evil.jsonl"
    assert (team.api.settings.datasets_dir / str(dataset["id"]) / "evil.jsonl").is_file()


def test_too_large_uploads_are_refused_whether_announced_or_streamed(team_with):
    team = team_with(LANNER_MAX_UPLOAD_BYTES="100")
    announced = upload(team.alice, "big.jsonl", "x" * 500)
    assert announced.status_code == 413 and "upload limit" in announced.json()["detail"]

    def chunks():  # no Content-Length: the limit is found while streaming
        for _ in range(10):
            yield b'{"text": "0123456789"}\n'

    streamed = team.alice.post("/api/datasets", params={"filename": "big.jsonl"}, content=chunks())
    assert streamed.status_code == 413
    assert leftovers(team.api) == [] and team.alice.get("/api/datasets").json()["total"] == 0


def test_the_per_user_quota_counts_what_one_already_keeps(team_with):
    team = team_with(LANNER_USER_QUOTA_BYTES=str(len(CHAT_ROWS) + 10))
    assert upload(team.alice, "one.jsonl", CHAT_ROWS).status_code == 201
    second = upload(team.alice, "two.jsonl", CHAT_ROWS)
    assert second.status_code == 413 and "quota" in second.json()["detail"]
    assert upload(team.bob, "bobs.jsonl", CHAT_ROWS).status_code == 201  # the quota is per user


def test_delete_is_for_the_owner_or_an_admin_and_not_while_a_job_needs_it(team, wakes):
    dataset = upload(team.alice, "pairs.jsonl", PREFERENCE_ROWS).json()
    folder = team.api.settings.datasets_dir / str(dataset["id"])
    job = team.alice.post("/api/jobs", json={"method": "dpo", "model": "builtin/SmolLM2-135M-Instruct",
                                             "dataset_id": dataset["id"]}).json()
    assert team.anonymous.delete(f"/api/datasets/{dataset['id']}").status_code == 401
    assert team.bob.delete(f"/api/datasets/{dataset['id']}").status_code == 403
    busy = team.alice.delete(f"/api/datasets/{dataset['id']}")
    assert busy.status_code == 409 and "cancel" in busy.json()["detail"]
    team.alice.post(f"/api/jobs/{job['id']}/cancel")
    assert team.alice.delete(f"/api/datasets/{dataset['id']}").status_code == 204
    assert not folder.exists() and team.alice.get(f"/api/datasets/{dataset['id']}").status_code == 404
    other = upload(team.bob, "b.jsonl", CHAT_ROWS).json()
    assert team.admin.delete(f"/api/datasets/{other['id']}").status_code == 204
    assert team.admin.delete("/api/datasets/999").status_code == 404


def test_of_two_deletes_at_once_one_deletes_and_the_other_is_a_404(team_on_each_database):
    # both read the dataset before either wrote: each answered 204 (the second deleted nothing)
    from lanner.backend.services import datasets
    from lanner.core import db
    from lanner.core.errors import UserError
    from lanner.core.models import Dataset, User

    team = team_on_each_database
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    with db.session_factory(team.api.settings.database_url)() as session:
        stale = session.get(Dataset, dataset_id)
        alice = session.get(User, stale.owner_id)
        assert team.alice.delete(f"/api/datasets/{dataset_id}").status_code == 204
        with pytest.raises(UserError) as error:
            datasets.delete(session, team.api.settings, alice, stale)
    assert error.value.status == 404 and error.value.message == f"No dataset {dataset_id}"


def test_preview_marks_the_trained_tokens_and_stats_count_them(team, allowed_smollm2):
    smollm2_dir = allowed_smollm2
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()
    model = str(smollm2_dir)
    shown = team.bob.get(f"/api/datasets/{dataset['id']}/preview", params={"model": model, "rows": 2})
    assert shown.status_code == 200, shown.text
    first = shown.json()["rows"][0]
    assert shown.json()["task"] == "sft" and [row["line"] for row in shown.json()["rows"]] == [1, 2]
    trained = "".join(s["text"] for s in first["segments"] if s["trained"])
    untrained = "".join(s["text"] for s in first["segments"] if not s["trained"])
    assert "hello 0" in trained and "hi 0" in untrained and "hi 0" not in trained
    assert 0 < first["trained_tokens"] < first["tokens"]
    stats = team.bob.get(f"/api/datasets/{dataset['id']}/token-stats", params={"model": model}).json()
    assert stats["sequences"] == 5 and stats["min"] <= stats["p50"] <= stats["max"] < 2048
    assert stats["over_max_seq_len"] == 0 and 0 < stats["trained_tokens"] < stats["total_tokens"]
    cut = team.bob.get(f"/api/datasets/{dataset['id']}/token-stats", params={"model": model, "max_seq_len": 16}).json()
    assert cut["over_max_seq_len"] == 5 and cut["trained_tokens"] == 0  # truncation leaves nothing to learn
    pairs = upload(team.alice, "pairs.jsonl", PREFERENCE_ROWS).json()
    both = team.bob.get(f"/api/datasets/{pairs['id']}/preview", params={"model": model, "rows": 1}).json()
    assert [row["sequence"] for row in both["rows"]] == ["chosen", "rejected"]


def test_rows_the_chat_template_refuses_are_previewed_as_refused_not_a_500(team, allowed_smollm2, monkeypatch):
    # a template that refuses roles out of turn (Mistral's, Gemma's system turn): a job leaves such rows out
    folder = team.api.settings.models_dir / "strict"
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(allowed_smollm2 / name, folder / name)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
        "{{ m.role + ': ' + m.content + '\\n' }}{% endfor %}{% if add_generation_prompt %}assistant: {% endif %}")
    user, answer = {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}
    rows = json.dumps({"messages": [user, answer]}) + "\n" + json.dumps({"messages": [user, user, answer]}) + "\n"
    dataset = upload(team.alice, "turns.jsonl", rows).json()
    shown = team.bob.get(f"/api/datasets/{dataset['id']}/preview", params={"model": str(folder), "rows": 2})
    assert shown.status_code == 200, shown.text
    good, refused = shown.json()["rows"]
    assert good["refused"] is None and good["segments"]
    assert refused == {"line": 2, "sequence": "completion", "tokens": 0, "trained_tokens": 0, "truncated": False,
                       "segments": [], "refused": "Conversation roles must alternate user/assistant/user/assistant/..."}
    stats = team.bob.get(f"/api/datasets/{dataset['id']}/token-stats", params={"model": str(folder)})
    assert stats.status_code == 200 and (stats.json()["sequences"], stats.json()["refused"]) == (1, 1)
    # a template for plain chat leaves tool calls out: refused too, as the job refuses such rows
    from lanner.core.tool_turns import LEFT_OUT

    call = {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    calling = upload(team.alice, "calls.jsonl", json.dumps({"messages": [user, call]}) + "\n").json()
    shown = team.bob.get(f"/api/datasets/{calling['id']}/preview", params={"model": str(allowed_smollm2)}).json()
    assert [row["refused"] for row in shown["rows"]] == [LEFT_OUT]


def test_preview_needs_a_tokenizer_on_this_machine(team):
    dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()
    builtin = team.bob.get(f"/api/datasets/{dataset['id']}/preview")
    assert builtin.status_code == 409 and "import-default-model" in builtin.json()["detail"]
    hub = team.bob.get(f"/api/datasets/{dataset['id']}/token-stats", params={"model": "Qwen/Qwen3-8B"})
    assert hub.status_code == 409 and "on this machine" in hub.json()["detail"]
    assert team.bob.get("/api/datasets/999/preview").status_code == 404
    assert team.anonymous.get(f"/api/datasets/{dataset['id']}/preview").status_code == 401


def test_while_the_builtin_model_is_imported_previews_wait_and_then_the_report_is_measured(team, smollm2_dir, wakes):
    """An import under way in another process (`lanner up`'s) holds its lock: the routes answer at
    once that it is coming; once it lands, the report stored at the upload gets its token lengths."""
    import fcntl

    models = team.api.settings.models_dir
    with open(models / ".smollm2-import.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        dataset = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()
        assert dataset["report"]["token_stats"] is None
        assert "being imported" in dataset["report"]["token_stats_error"]
        for route in ("preview", "token-stats"):
            waiting = team.bob.get(f"/api/datasets/{dataset['id']}/{route}")
            assert waiting.status_code == 503 and "being imported" in waiting.json()["detail"]
            assert int(waiting.headers["Retry-After"]) > 0
        (models / smollm2_dir.name).symlink_to(smollm2_dir)  # the import lands (renamed into place)
    spec = {"method": "lora", "model": "builtin/SmolLM2-135M-Instruct", "dataset_id": dataset["id"], "gpus": 0}
    job = team.alice.post("/api/jobs", json=spec).json()  # its estimate sizes a batch by the rows, measured now

    def estimate(**changes) -> int:
        return team.alice.post("/api/jobs/estimate", json={**spec, **changes}).json()["estimate"]["total_bytes"]

    assert job["memory_estimate_bytes"] == estimate() < estimate(dataset_id=99)  # 99: no dataset, no rows measured
    assert team.bob.get(f"/api/datasets/{dataset['id']}/preview").status_code == 200
    report = team.bob.get(f"/api/datasets/{dataset['id']}").json()["report"]
    assert report["token_stats"]["model"] == "builtin/SmolLM2-135M-Instruct" and report["token_stats"]["sequences"] == 5
    assert report["token_stats_error"] is None and report["token_stats_waiting_for"] is None
    assert team.alice.get("/api/datasets").json()["items"][0]["report"] == report  # stored, not measured again


def test_an_upload_that_would_fill_the_disk_is_refused(team_with):
    team = team_with(LANNER_MIN_FREE_BYTES=str(2**62))
    response = upload(team.alice, "chat.jsonl", CHAT_ROWS)
    assert response.status_code == 507 and "disk space" in response.json()["detail"]
    assert leftovers(team.api) == [] and team.alice.get("/api/datasets").json()["total"] == 0


def test_the_upload_report_has_token_lengths_for_the_chosen_model(team, allowed_smollm2):
    smollm2_dir = allowed_smollm2
    measured = upload(team.alice, "chat.jsonl", CHAT_ROWS, model=str(smollm2_dir)).json()["report"]
    stats = measured["token_stats"]
    assert stats["model"] == str(smollm2_dir) and stats["sequences"] == 5 and stats["task"] == "sft"
    assert 0 < stats["min"] <= stats["p95"] <= stats["max"] and 0 < stats["trained_tokens"] < stats["total_tokens"]
    # Without a tokenizer on this machine the upload is kept, and the report says why it has no lengths.
    unmeasured = upload(team.alice, "chat.jsonl", CHAT_ROWS, model="Qwen/Qwen3-8B")
    assert unmeasured.status_code == 201 and unmeasured.json()["report"]["token_stats"] is None
    assert "on this machine" in unmeasured.json()["report"]["token_stats_error"]


def test_concurrent_first_requests_load_one_tokenizer(smollm2_dir, tmp_path):
    """The dataset page asks for a preview and token statistics at once: their first loads of a
    tokenizer used to race (two copies, and at times a 409 from transformers' lazy imports)."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    from lanner.backend import dataset_preview

    folder = tmp_path / "tokenizer"  # a folder no earlier test has cached
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (smollm2_dir / name).exists():
            shutil.copy(smollm2_dir / name, folder / name)
    with ThreadPoolExecutor(8) as pool:
        loaded = list(pool.map(dataset_preview.load_tokenizer, [str(folder)] * 8))
    assert len({id(tokenizer) for tokenizer in loaded}) == 1
    assert loaded[0]("hello", add_special_tokens=False)["input_ids"]


def messy_alpaca() -> str:
    """The issue's file: 50 lines, one holding only a carriage return, one with a wrong type and a
    missing field, one with a key that differs from a field only in case, one unterminated string."""
    lines = [json.dumps({"instruction": f"question {n}", "output": f"answer {n}"}) for n in range(1, 51)]
    lines[4] = "\r"
    lines[9] = json.dumps({"instruction": 7})
    lines[14] = json.dumps({"instruction": "question 15", "Input": "context", "output": "answer 15"})
    lines[19] = '{"instruction": "unterminated'
    return "\n".join(lines) + "\n"


def test_the_report_accounts_for_every_line_of_the_file(team_on_each_database):
    team = team_on_each_database
    created = upload(team.alice, "messy.jsonl", messy_alpaca())
    assert created.status_code == 201, created.text
    dataset = team.bob.get(f"/api/datasets/{created.json()['id']}").json()
    report = dataset["report"]
    assert (dataset["rows"], dataset["usable_rows"], report["bad_row_count"]) == (50, 47, 3)
    assert report["bad_rows"] == [
        {"line": 5, "reason": "blank line"},
        {"line": 10, "reason": "'instruction' is a number, not text; missing 'output'"},
        {"line": 20, "reason": "malformed JSON: Unterminated string starting at column 17"}]
    assert report["warning_count"] == 1 and report["warnings"] == [
        {"line": 15, "message": "key 'Input' looks like 'input' and was ignored: field names must match exactly"}]


def test_every_usable_row_can_be_previewed_under_its_line(team, allowed_smollm2):
    dataset = upload(team.alice, "messy.jsonl", messy_alpaca()).json()
    lines, offset = [], 0
    while True:
        page = team.bob.get(f"/api/datasets/{dataset['id']}/preview",
                            params={"model": str(allowed_smollm2), "offset": offset, "rows": 20})
        assert page.status_code == 200, page.text
        assert (page.json()["total"], page.json()["offset"], page.json()["numbered_by"]) == (47, offset, "line")
        if not page.json()["rows"]:
            break
        for sequence in page.json()["rows"]:
            lines.append(sequence["line"])
            assert f"answer {sequence['line']}" in "".join(s["text"] for s in sequence["segments"] if s["trained"])
        offset += 20
    assert lines == [n for n in range(1, 51) if n not in (5, 10, 20)]
