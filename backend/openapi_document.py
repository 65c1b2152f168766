"""The API's OpenAPI document, with the messages of its streams among the components, so that the web
UI's types are generated from one file (frontend/openapi.json -> frontend/src/api/schema.d.ts).

    python -m lanner.backend.openapi_document frontend/openapi.json

builds the app without serving it (no database, no Redis) and writes the document; `./lanner
api-types` runs it and then the TypeScript generator.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from fastapi import FastAPI
from fastapi.encoders import jsonable_encoder
from pydantic import TypeAdapter
from pydantic.json_schema import GenerateJsonSchema

from lanner.backend.schemas import playground
from lanner.core.messages import records

# Messages sent over WebSockets and Redis, which no route declares (pydantic models, enums): one line each.
MESSAGE_TYPES: list[type] = [
    records.JobEventType, *records.RECORD_EVENTS,  # a job's stream (/ws/jobs/{id})
    playground.GenerateRequest, playground.StopAnswers,  # what the playground socket (/ws/playground) is asked
    playground.SocketStatus, playground.SocketToken, playground.SocketDone, playground.SocketError,  # and sends
]


def document_messages(app: FastAPI, types: list[type] = MESSAGE_TYPES) -> None:
    """Adds `types` (and the models they refer to) to the document's components.schemas."""
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        if types:
            generator = GenerateJsonSchema(ref_template="#/components/schemas/{model}")
            _, found = generator.generate_definitions(
                inputs=[(kind, "serialization", TypeAdapter(kind).core_schema) for kind in types])
            found = jsonable_encoder(found, exclude_none=True)  # as FastAPI writes its own ("default": null goes)
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for name, schema in found.items():
                if name in schemas and schemas[name] != schema:
                    raise ValueError(f"two different schemas are named {name} in the OpenAPI document")
                schemas[name] = schema
        return document

    app.openapi = openapi


def document_text() -> str:
    from lanner.backend.app import create_app

    return json.dumps(create_app().openapi(), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: python -m lanner.backend.openapi_document OUT.json")
    Path(args[0]).write_text(document_text(), encoding="utf-8")


if __name__ == "__main__":
    main()
