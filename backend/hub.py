"""The model hub, spoken over plain HTTP (the part of the Hugging Face API Lanner uses):

  GET {hub}/api/models?search=&limit=&filter=text-generation   search
  GET {hub}/api/models/{repo}/revision/{revision}?blobs=true    a repo's commit and files with sizes
  GET {hub}/{repo}/resolve/{commit}/{file}                       a file (redirects to a CDN; Range resumes)

Any failure to reach the hub is HubOffline, so the API can answer "offline" in words; an answer
the hub gives (unknown repo, gated repo) is a UserError with the hub's status and the code REFUSED,
which the catalog's routes turn into their own answer."""
from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lanner.core.errors import UserError

CHUNK = 1024 * 1024
REFUSED = "hub_refused"


class HubOffline(Exception):
    """The hub cannot be reached from this machine (no network, DNS, refused, timed out)."""


@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int | None


@dataclass(frozen=True)
class RepoInfo:
    repo_id: str
    commit: str
    gated: bool
    files: list[RepoFile]


class _SameHostAuthRedirects(urllib.request.HTTPRedirectHandler):
    """Follows the hub's redirects to its CDN, keeping Range but dropping the hub token there."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and urllib.parse.urlsplit(newurl).netloc != urllib.parse.urlsplit(req.full_url).netloc:
            new.remove_header("Authorization")
        return new


_opener = urllib.request.build_opener(_SameHostAuthRedirects)


class Hub:
    def __init__(self, url: str, timeout: float, token: str | None = None):
        self.url, self.timeout, self.token = url.rstrip("/"), timeout, token

    def _open(self, path: str, headers: dict[str, str] | None = None):
        request = urllib.request.Request(f"{self.url}{path}", headers=dict(headers or {}))
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            return _opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise UserError(exc.code, _hub_message(exc), code=REFUSED) from None
        except OSError as exc:  # URLError, refused, reset, timeouts
            raise HubOffline(f"the model hub at {self.url} cannot be reached from this machine "
                             f"({exc.__class__.__name__})") from None

    def _json(self, path: str):
        with self._open(path) as response:
            try:
                return json.load(response)
            except (ValueError, OSError):
                raise HubOffline(f"the model hub at {self.url} sent an unreadable answer") from None

    def search(self, query: str, limit: int) -> list[dict]:
        params = urllib.parse.urlencode({"search": query, "limit": limit, "filter": "text-generation"})
        found = self._json(f"/api/models?{params}")
        return [item for item in found if isinstance(item, dict) and isinstance(item.get("id"), str)] \
            if isinstance(found, list) else []

    def repo_info(self, repo_id: str, revision: str) -> RepoInfo:
        quoted = urllib.parse.quote(revision, safe="")
        info = self._json(f"/api/models/{repo_id}/revision/{quoted}?blobs=true")
        if not isinstance(info, dict) or not isinstance(info.get("siblings"), list):
            raise HubOffline(f"the model hub at {self.url} sent an unreadable answer for {repo_id}")
        files = [RepoFile(item["rfilename"], item.get("size") if isinstance(item.get("size"), int) else None)
                 for item in info["siblings"] if isinstance(item, dict) and isinstance(item.get("rfilename"), str)]
        return RepoInfo(repo_id, str(info.get("sha") or revision), bool(info.get("gated")), files)

    def download(self, repo_id: str, commit: str, name: str, target: Path,
                 progress: Callable[[int], None] = lambda written: None) -> None:
        """Writes the file to `target`, continuing a partial file with an HTTP range. A connection
        that drops mid-file is HubOffline, and what arrived stays for the next attempt to continue."""
        have = target.stat().st_size if target.exists() else 0
        path = f"/{repo_id}/resolve/{urllib.parse.quote(commit, safe='')}/{urllib.parse.quote(name)}"
        try:
            response = self._open(path, {"Range": f"bytes={have}-"} if have else None)
        except UserError as exc:
            if exc.status != 416:  # 416: nothing after what we have, the file is whole already
                raise
            return
        resumed = response.status == 206
        expected = _total_size(response, have if resumed else 0)
        with response, open(target, "ab" if resumed else "wb") as out:
            try:
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    progress(len(chunk))
            except (OSError, http.client.HTTPException) as exc:
                raise HubOffline(f"the download of {name} broke off ({exc.__class__.__name__})") from None
            out.flush()
            os.fsync(out.fileno())
            written = out.tell()
        if expected is not None and written != expected:  # http.client ends a cut-off body quietly
            raise HubOffline(f"the download of {name} broke off at {written} of {expected} bytes")


def _total_size(response, offset: int) -> int | None:
    total = (response.headers.get("Content-Range") or "").rpartition("/")[2]
    if total.isdigit():
        return int(total)
    length = response.headers.get("Content-Length")
    return offset + int(length) if length and length.isdigit() else None


def _hub_message(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read(64 * 1024) or b"{}")
        return str(body.get("error") or body.get("detail") or exc.reason)
    except (ValueError, OSError, AttributeError):
        return str(exc.reason)
