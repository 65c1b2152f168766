"""Cross-site request forgery: a state-changing request that carries the session cookie must come
from a page of this studio. Browsers send Origin with every POST, PUT, PATCH and DELETE (a form post
and a text/plain fetch from another site included); SameSite=Lax alone lets any other port of the
same host through, since a site is the host without its port. Requests with a bearer token are
exempt (a script's, which no browser adds by itself), and so are requests with no Origin at all (not
a browser's, or one that sent no cookie across sites)."""
from __future__ import annotations

from starlette.requests import cookie_parser

from lanner.backend.input_guard import send_refusal
from lanner.backend.security import SESSION_COOKIE, is_same_origin

SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}


class SameOriginWrites:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] not in SAFE_METHODS:
            headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
            origin = headers.get("origin")
            bearer = headers.get("authorization", "")[:7].lower() == "bearer "
            if origin and not bearer and SESSION_COOKIE in cookie_parser(headers.get("cookie", "")) \
                    and not is_same_origin(origin, headers.get("host", "")):
                return await send_refusal(send, 403, f"A signed-in change must come from this studio's own pages, "
                                                     f"not from {origin[:200]}: open the studio at its own address")
        return await self.app(scope, receive, send)
