"""Input no part of the studio can store or answer is refused at the edge with a 422 in words, one
rule for every route instead of a check per field: a NUL character in the path or a query
parameter (PostgreSQL refuses NUL in text), and JSON bodies with NaN, Infinity, numbers beyond
float's range, nesting too deep to parse, NUL characters or lone surrogates (lanner.core.strict_json).
A refusal is one entry in FastAPI's own 422 format, {"loc", "msg", "type"}, so every 422 reads alike."""
from __future__ import annotations

import json
from email.message import Message
from typing import Any
from urllib.parse import unquote_to_bytes

from lanner.core import strict_json

UNSTORABLE = "unstorable_input"


def _is_json(headers: dict[bytes, bytes]) -> bool:
    """FastAPI reads a body as JSON when it has no content type or an application/json or +json one."""
    value = headers.get(b"content-type")
    if not value:
        return True
    message = Message()
    message["content-type"] = value.decode("latin-1")
    return message.get_content_maintype() == "application" and (
        message.get_content_subtype() == "json" or message.get_content_subtype().endswith("+json"))


def _issue(where: str, message: str) -> list[dict[str, Any]]:
    return [{"loc": [where], "msg": message, "type": UNSTORABLE}]


def url_refusal(scope) -> list[dict[str, Any]] | None:
    """Why the request's path or query cannot be taken, or None."""
    nul = "holds a NUL character (%00), which no path or query parameter here may contain"
    if "\x00" in scope.get("path", ""):
        return _issue("path", f"The path {nul}")
    if b"\x00" in unquote_to_bytes(scope.get("query_string", b"")):
        return _issue("query", f"The query {nul}")
    return None


def body_refusal(scope, body: bytes) -> list[dict[str, Any]] | None:
    """Why a JSON body cannot be taken, or None (a body that is not JSON at all is left to FastAPI's 400)."""
    if not body or not _is_json(dict(scope["headers"])):
        return None
    try:
        strict_json.loads(body)
    except strict_json.UnstorableJson as error:
        return _issue("body", str(error))
    except ValueError:  # not JSON, or not UTF-8: FastAPI answers it as before
        return None
    return None


async def send_refusal(send, status: int, detail: str | list[dict[str, Any]]) -> None:
    payload = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
