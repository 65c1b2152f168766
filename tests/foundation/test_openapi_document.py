"""The web UI's API types are generated from the committed OpenAPI document: it must be the app's."""
from __future__ import annotations

from typing import Literal

import pytest
from pydantic import BaseModel

from lanner.backend.app import create_app
from lanner.backend.openapi_document import document_messages, document_text
from support import REPO

COMMITTED = REPO / "frontend" / "openapi.json"


def test_the_committed_document_is_the_apps():
    if document_text() != COMMITTED.read_text(encoding="utf-8"):  # not assert ==: a 200 kB diff hides the message
        pytest.fail("the API changed: run `./lanner api-types` and commit frontend/openapi.json and "
                    "frontend/src/api/schema.d.ts", pytrace=False)


class _Part(BaseModel):
    size: int
    note: str | None = None


class _Message(BaseModel):
    type: Literal["part"] = "part"
    part: _Part


def test_a_message_model_lands_in_the_components_with_what_it_refers_to():
    app = create_app()
    document_messages(app, [_Message])
    schemas = app.openapi()["components"]["schemas"]
    assert schemas["_Message"]["properties"]["part"] == {"$ref": "#/components/schemas/_Part"}
    assert "default" not in schemas["_Part"]["properties"]["note"]  # as FastAPI writes its own schemas
    assert "StepMetrics" in schemas  # a job's stream events are in the served document
    assert "JobOut" in schemas


def test_two_different_schemas_of_one_name_are_refused():
    class JobOut(BaseModel):
        other: str

    app = create_app()
    document_messages(app, [JobOut])
    with pytest.raises(ValueError, match="JobOut"):
        app.openapi()
