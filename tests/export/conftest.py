"""Fixtures for the export tests: a LoRA adapter on the built-in SmolLM2 with random B matrices
(so it is not a no-op), one full export of it shared by the tests that inspect it, and the settings
of a studio (data dir with the built-in model, database, Redis) for the export job tests."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
from export_helpers import BASE_MODEL_NAME, EXPORT_REDIS_URL, make_adapter


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """This box's 2 cores are shared by several people: two spinning torch threads then run a forward
    pass 2-3x slower than one. Restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def without_triton_interpreter(monkeypatch):
    """The studio's code here, in this process or in the processes it starts, as a worker on the CPU runs it:
    without the Triton interpreter that tests/kernels turns on for the session (support.process_env)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)


@pytest.fixture(scope="session")
def trained_adapter(smollm2_dir, tmp_path_factory) -> Path:
    return make_adapter(smollm2_dir, tmp_path_factory.mktemp("train") / "adapter")


@pytest.fixture(scope="session")
def full_export(smollm2_dir, trained_adapter, tmp_path_factory):
    """One export with every format the tests inspect; the progress events it emitted; its duration."""
    from lanner.worker.export import ExportRequest, run_export

    out = tmp_path_factory.mktemp("export") / "job-1"
    events: list[tuple[str, float]] = []
    request = ExportRequest(base_model_dir=smollm2_dir, adapter_dir=trained_adapter, out_dir=out,
                            base_model_name=BASE_MODEL_NAME, name="smollm2-lanner", merged_dtype="bfloat16",
                            gguf_types=("f16", "bf16", "q8_0", "q4_k_m"))
    started = time.monotonic()
    manifest = run_export(request, progress=lambda stage, fraction: events.append((stage, fraction)))
    return {"manifest": manifest, "out": out, "events": events, "seconds": time.monotonic() - started}


@pytest.fixture
def settings(tmp_path, smollm2_dir, monkeypatch):
    from redis import Redis

    from lanner.backend import security
    from lanner.core import db
    from lanner.core.settings import Settings, get_settings

    data_dir = tmp_path / "data"
    (data_dir / "models").mkdir(parents=True)
    (data_dir / "models" / "SmolLM2-135M-Instruct").symlink_to(smollm2_dir)
    settings = Settings(data_dir=data_dir, database_url=f"sqlite:///{data_dir / 'lanner.db'}",
                        redis_url=EXPORT_REDIS_URL)
    for key, value in (("LANNER_DATA_DIR", data_dir), ("LANNER_DATABASE_URL", settings.database_url),
                       ("LANNER_REDIS_URL", EXPORT_REDIS_URL), ("OMP_NUM_THREADS", "1")):
        monkeypatch.setenv(key, str(value))
    db.migrate(settings.database_url)
    monkeypatch.setattr(security, "SCRYPT_N", 2**10)  # fast hashing for the test user
    Redis.from_url(EXPORT_REDIS_URL).flushdb()
    yield settings
    Redis.from_url(EXPORT_REDIS_URL).flushdb()
    get_settings.cache_clear()  # signed_in_client's app read this test's environment
