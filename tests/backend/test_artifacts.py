"""Artifacts: listing, ranged downloads, deletion, and no way out of the data directory."""
from __future__ import annotations

import io
import os
import tarfile

import pytest

from lanner.core import db
from lanner.core.models import Artifact, ArtifactKind, Job, JobStatus

from backend_helpers import CHAT_ROWS, upload

CONTENT = bytes(range(256)) * 40  # 10 240 bytes


@pytest.fixture
def produced(team, wakes):
    """A succeeded job of alice's with a GGUF file, an adapter folder and rows that try to escape."""
    dataset_id = upload(team.alice, "chat.jsonl", CHAT_ROWS).json()["id"]
    job_id = team.alice.post("/api/jobs", json={"method": "lora", "model": "builtin/SmolLM2-135M-Instruct",
                                                "dataset_id": dataset_id}).json()["id"]
    data = team.api.settings.data_dir
    folder = data / "artifacts" / str(job_id)
    (folder / "adapter").mkdir(parents=True)
    (folder / "model.gguf").write_bytes(CONTENT)
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    secret = data.parent / "secret.txt"
    secret.write_text("outside the data dir")
    os.symlink(secret, folder / "adapter" / "link.txt")
    os.symlink(secret, folder / "escape.gguf")
    ids = {}
    with db.session_factory(team.api.settings.database_url)() as session:
        session.get(Job, job_id).status = JobStatus.succeeded
        for name, path in [("gguf", f"artifacts/{job_id}/model.gguf"), ("adapter", f"artifacts/{job_id}/adapter"),
                           ("dotdot", "../secret.txt"), ("absolute", str(secret)),
                           ("symlink", f"artifacts/{job_id}/escape.gguf"), ("missing", f"artifacts/{job_id}/gone")]:
            kind = ArtifactKind.adapter if name == "adapter" else ArtifactKind.gguf  # the rest: files that should be
            artifact = Artifact(job_id=job_id, kind=kind, name=name, path=path, size_bytes=len(CONTENT))
            session.add(artifact)
            session.flush()
            ids[name] = artifact.id
        session.commit()
    return job_id, ids, secret


def test_list_shows_every_artifact_and_the_files_of_folders(team, produced):
    job_id, ids, _ = produced
    listed = team.bob.get(f"/api/jobs/{job_id}/artifacts").json()
    assert [a["name"] for a in listed] == ["gguf", "adapter", "dotdot", "absolute", "symlink", "missing"]
    assert listed[1]["files"] == ["adapter_config.json"]  # the symlink out is not listed
    assert team.bob.get("/api/jobs/999/artifacts").status_code == 404


def test_download_whole_and_in_ranges(team, produced):
    _, ids, _ = produced
    url = f"/api/artifacts/{ids['gguf']}/download"
    whole = team.bob.get(url)
    assert whole.status_code == 200 and whole.content == CONTENT and whole.headers["accept-ranges"] == "bytes"
    part = team.bob.get(url, headers={"Range": "bytes=100-199"})
    assert part.status_code == 206 and part.content == CONTENT[100:200]
    assert part.headers["content-range"] == f"bytes 100-199/{len(CONTENT)}"
    assert team.bob.get(url, headers={"Range": "bytes=10000-"}).content == CONTENT[10000:]
    assert team.bob.get(url, headers={"Range": "bytes=-40"}).content == CONTENT[-40:]
    for bad in ("bytes=20000-", "bytes=200-100", "bytes=abc", "items=0-1", "bytes=-0", "bytes=0-1,5-6"):
        refused = team.bob.get(url, headers={"Range": bad})
        assert refused.status_code == 416, bad
        assert refused.headers["content-range"] == f"bytes */{len(CONTENT)}" and "detail" in refused.json()
    inner = team.bob.get(f"/api/artifacts/{ids['adapter']}/download", params={"file": "adapter_config.json"})
    assert inner.status_code == 200 and inner.text == "{}"
    assert "?archive=tar" in team.bob.get(f"/api/artifacts/{ids['adapter']}/download").json()["detail"]
    assert team.bob.get(url, params={"file": "x"}).status_code == 422
    assert team.bob.get(f"/api/artifacts/{ids['missing']}/download").status_code == 404
    assert team.anonymous.get(url).status_code == 401


@pytest.mark.parametrize("name, file", [
    ("dotdot", None), ("absolute", None), ("symlink", None),
    ("adapter", "../model.gguf/../../../secret.txt"), ("adapter", "../../../../secret.txt"),
    ("adapter", "/etc/passwd"), ("adapter", "link.txt"), ("adapter", "..%2F..%2Fsecret.txt"),
])
def test_no_download_reads_outside_the_data_dir(team, produced, name, file):
    _, ids, _ = produced
    response = team.bob.get(f"/api/artifacts/{ids[name]}/download", params={"file": file} if file else {})
    assert response.status_code == 404 and "outside the data dir" not in response.text


def test_traversal_in_the_url_path_finds_no_route(team, produced):
    for url in ("/api/artifacts/..%2F..%2Fsecret.txt/download", "/api/artifacts/1/../../../secret.txt"):
        response = team.bob.get(url)  # the client resolves the dots: at most the web UI answers
        assert "outside the data dir" not in response.text


def test_delete_is_for_the_owner_or_an_admin_and_never_touches_outside(team, produced):
    job_id, ids, secret = produced
    assert team.bob.delete(f"/api/artifacts/{ids['gguf']}").status_code == 403
    assert team.alice.delete(f"/api/artifacts/{ids['gguf']}").status_code == 204
    assert not (team.api.settings.artifacts_dir / str(job_id) / "model.gguf").exists()
    for name in ("dotdot", "absolute", "symlink"):
        assert team.admin.delete(f"/api/artifacts/{ids[name]}").status_code == 204
    assert secret.read_text() == "outside the data dir"
    assert team.admin.delete(f"/api/artifacts/{ids['adapter']}").status_code == 204
    assert not (team.api.settings.artifacts_dir / str(job_id) / "adapter").exists()
    assert team.admin.delete("/api/artifacts/999").status_code == 404
    assert [a["name"] for a in team.alice.get(f"/api/jobs/{job_id}/artifacts").json()] == ["missing"]


def test_head_answers_the_size_and_if_none_match_answers_304_while_the_file_is_unchanged(team, produced):
    _, ids, _ = produced
    url = f"/api/artifacts/{ids['gguf']}/download"
    head = team.bob.head(url)
    assert head.status_code == 200 and head.content == b""
    assert int(head.headers["content-length"]) == len(CONTENT) and head.headers["accept-ranges"] == "bytes"
    etag = head.headers["etag"]
    assert team.bob.get(url).headers["etag"] == etag
    unchanged = team.bob.get(url, headers={"If-None-Match": etag})
    assert unchanged.status_code == 304 and unchanged.content == b"" and unchanged.headers["etag"] == etag
    assert team.bob.get(url, headers={"If-None-Match": f'"other", W/{etag}'}).status_code == 304
    assert team.bob.get(url, headers={"If-None-Match": etag, "Range": "bytes=0-3"}).status_code == 304
    changed = team.bob.get(url, headers={"If-None-Match": '"other"'})
    assert changed.status_code == 200 and changed.content == CONTENT
    inner = team.bob.head(f"/api/artifacts/{ids['adapter']}/download", params={"file": "adapter_config.json"})
    assert inner.status_code == 200 and inner.headers["content-length"] == "2"
    assert team.bob.head(f"/api/artifacts/{ids['missing']}/download").status_code == 404
    assert team.anonymous.head(url).status_code == 401


def test_a_folder_downloads_whole_as_a_tar_stream_without_following_links_out(team, produced):
    job_id, ids, secret = produced
    adapter = team.api.settings.artifacts_dir / str(job_id) / "adapter"
    files = {"adapter_config.json": b"{}", "adapter_model.safetensors": CONTENT + b"\x00" * 3,
             "nested/tokenizer.json": b'{"a": 1}', "README.md": b""}
    (adapter / "nested").mkdir()
    for name, content in files.items():
        (adapter / name).write_bytes(content)
    os.symlink(secret.parent, adapter / "linked-folder")  # with link.txt: links out of the data dir
    url = f"/api/artifacts/{ids['adapter']}/download"
    response = team.bob.get(url, params={"archive": "tar"}, headers={"Range": "bytes=0-9"})
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-tar"
    assert response.headers["content-disposition"] == 'attachment; filename="job-%d-adapter.tar"' % job_id
    assert response.headers["accept-ranges"] == "none" and "outside the data dir" not in response.text
    with tarfile.open(fileobj=io.BytesIO(response.content)) as archive:
        read = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}
    assert read == {f"job-{job_id}-adapter/{name}": content for name, content in files.items()}
    head = team.bob.head(url, params={"archive": "tar"})
    assert head.status_code == 200 and head.content == b"" and head.headers["accept-ranges"] == "none"
    assert team.anonymous.get(url, params={"archive": "tar"}).status_code == 401


@pytest.mark.parametrize("name, params, words", [
    ("gguf", {"archive": "tar"}, "is a single file"), ("adapter", {"archive": "tar", "file": "README.md"}, "not both"),
])
def test_an_archive_is_only_of_a_folder(team, produced, name, params, words):
    _, ids, _ = produced
    response = team.bob.get(f"/api/artifacts/{ids[name]}/download", params=params)
    assert response.status_code == 422 and words in response.json()["detail"]
    assert team.bob.get(f"/api/artifacts/{ids['adapter']}/download", params={"archive": "zip"}).status_code == 422
