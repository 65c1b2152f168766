from __future__ import annotations

import pytest
from pydantic import ValidationError

from lanner.core.settings import Settings


def test_defaults_put_everything_under_the_data_dir(monkeypatch, tmp_path):
    for key in ("LANNER_DATABASE_URL", "LANNER_REDIS_URL", "LANNER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LANNER_DATA_DIR", str(tmp_path / "d"))
    settings = Settings()
    assert settings.database_url == f"sqlite:///{tmp_path / 'd' / 'lanner.db'}"
    assert settings.redis_url == "redis://127.0.0.1:6379/0"
    assert settings.port == 8000
    settings.ensure_dirs()
    assert settings.models_dir.is_dir() and settings.logs_dir.is_dir()


def test_environment_overrides(monkeypatch):
    monkeypatch.setenv("LANNER_DATABASE_URL", "postgresql+psycopg://u@db/lanner")
    monkeypatch.setenv("LANNER_PORT", "9000")
    settings = Settings()
    assert settings.database_url == "postgresql+psycopg://u@db/lanner" and settings.port == 9000


def test_a_wrong_port_is_refused_clearly(monkeypatch):
    monkeypatch.setenv("LANNER_PORT", "99999")
    with pytest.raises(ValidationError, match="port"):
        Settings()
