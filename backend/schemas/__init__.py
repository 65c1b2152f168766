"""Pydantic request and response schemas, apart from the ORM models in lanner.core.models."""
