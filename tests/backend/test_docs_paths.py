"""The API's documents at the site's root point to /api/, where they are served, not to the web UI."""
from __future__ import annotations

import pytest


@pytest.mark.parametrize("path, target, served", [
    ("/openapi.json", "/api/openapi.json", "application/json"),
    ("/docs", "/api/docs", "text/html"),
    ("/redoc", "/api/redoc", "text/html"),
])
def test_the_root_document_paths_redirect_to_the_api(api, path, target, served):
    client = api.client()
    for method in (client.get, client.head):
        redirect = method(path, follow_redirects=False)
        assert redirect.status_code == 308 and redirect.headers["location"] == target
    followed = client.get(path)
    assert followed.status_code == 200 and followed.headers["content-type"].startswith(served)
    assert b"/api/openapi.json" in followed.content or followed.json()["info"]["title"] == "Lanner"
