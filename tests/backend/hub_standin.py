"""A stand-in for the Hugging Face hub: a real HTTP server on 127.0.0.1 that speaks the part of the
hub's API lanner.backend.hub uses (search, a repo's files at a revision, file downloads that
redirect to a CDN on another host name and honour Range). It can cut a download off part-way, once,
to play a dropped connection."""
from __future__ import annotations

import hashlib
import json
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False
    downloads: int = 0

    @property
    def commit(self) -> str:
        return hashlib.sha1("".join(sorted(self.files)).encode()).hexdigest()


@dataclass
class Seen:
    path: str
    host: str
    authorization: str | None
    range: str | None


@dataclass
class StandInHub:
    repos: dict[str, Repo]
    token: str = "hf_standin_token"
    cut_after: dict[str, int] = field(default_factory=dict)  # file name -> bytes sent before dropping, once
    seen: list[Seen] = field(default_factory=list)

    def start(self) -> "StandInHub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                hub.seen.append(Seen(self.path, self.headers.get("Host", ""), self.headers.get("Authorization"),
                                     self.headers.get("Range")))
                hub.answer(self)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- the API ---------------------------------------------------------------------------------
    def answer(self, request: BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(request.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        if url.path == "/api/models":
            return self.search(request, query)
        if match := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", url.path):
            return self.info(request, match[1])
        if match := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", url.path):
            return self.resolve(request, match[1], urllib.parse.unquote(match[3]))
        if match := re.fullmatch(r"/cdn/([^/]+/[^/]+)/(.+)", url.path):
            return self.cdn(request, match[1], urllib.parse.unquote(match[2]))
        self.send_json(request, 404, {"error": "Not Found"})

    def search(self, request, query: dict) -> None:
        words = query.get("search", "").lower()
        found = [{"id": repo_id, "downloads": repo.downloads, "likes": 1, "gated": "manual" if repo.gated else False,
                  "pipeline_tag": "text-generation"}
                 for repo_id, repo in self.repos.items() if words in repo_id.lower()]
        self.send_json(request, 200, found[:int(query.get("limit", 20))])

    def info(self, request, repo_id: str) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:  # the hub answers 401, not 404, for a repo it will not show
            return self.send_json(request, 401, {"error": "Repository Not Found"})
        self.send_json(request, 200, {
            "id": repo_id, "sha": repo.commit, "gated": "manual" if repo.gated else False, "private": False,
            "siblings": [{"rfilename": name, "size": len(content)} for name, content in repo.files.items()]})

    def resolve(self, request, repo_id: str, name: str) -> None:
        repo = self.repos.get(repo_id)
        if repo is None or name not in repo.files:
            return self.send_json(request, 404, {"error": "Entry not found"})
        if repo.gated and request.headers.get("Authorization") != f"Bearer {self.token}":
            return self.send_json(request, 401, {"error": f"Access to model {repo_id} is restricted"})
        # The real hub sends large files to a CDN on another host; "localhost" is another host name here.
        request.send_response(302)
        request.send_header("Location", f"http://localhost:{self.port}/cdn/{repo_id}/{urllib.parse.quote(name)}")
        request.send_header("Content-Length", "0")
        request.end_headers()

    def cdn(self, request, repo_id: str, name: str) -> None:
        content = self.repos[repo_id].files[name]
        start = 0
        wanted = re.fullmatch(r"bytes=(\d+)-", request.headers.get("Range") or "")
        if wanted:
            start = int(wanted[1])
            if start >= len(content):
                request.send_response(416)
                request.send_header("Content-Range", f"bytes */{len(content)}")
                request.send_header("Content-Length", "0")
                request.end_headers()
                return
            request.send_response(206)
            request.send_header("Content-Range", f"bytes {start}-{len(content) - 1}/{len(content)}")
        else:
            request.send_response(200)
        body = content[start:]
        request.send_header("Content-Length", str(len(body)))
        request.send_header("Content-Type", "application/octet-stream")
        request.end_headers()
        cut = self.cut_after.pop(name, None)
        request.wfile.write(body if cut is None else body[:cut])
        if cut is not None:
            request.close_connection = True

    @staticmethod
    def send_json(request, status: int, payload) -> None:
        body = json.dumps(payload).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)
