"""The studio on a GPU, end to end (issue 20): `lanner up` on SQLite with a worker pinned to the GPU,
driven through the HTTP API and WebSockets as the browser drives it. Skipped without a CUDA GPU; on
the lent GPU machine, docs/device-runs.md says how the bundle and these tests are run."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpu_helpers import StudioClient, saved_llama3_8b
from support import TEST_CACHE, RunningStack, free_port, stack_env

MODELS = TEST_CACHE / "gpu-models"


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run on the GPU machine: docs/device-runs.md)")
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def llama3_8b_dir(request) -> Path:
    """Random weights of the Llama-3 8B shape, saved once per machine where the studio may read local
    models, with SmolLM2's tokenizer: the bundle's copy on the GPU machine (tools/device), else the
    imported model's."""
    tokenizer = os.environ.get("LANNER_TEST_TOKENIZER_DIR") or request.getfixturevalue("smollm2_dir")
    return saved_llama3_8b(MODELS / "llama3-8b-random", tokenizer)


@pytest.fixture(scope="session")
def gpu_stack(tmp_path_factory):
    """`lanner up` on SQLite with its own Redis, one worker per visible GPU; local models from MODELS."""
    assert _cuda()
    tmp = tmp_path_factory.mktemp("gpu-stack")
    MODELS.mkdir(parents=True, exist_ok=True)
    env = stack_env(tmp, f"redis://127.0.0.1:{free_port()}/0")
    env["LANNER_LOCAL_MODEL_DIRS"] = f"{tmp / 'data' / 'models'}:{MODELS}"
    running = RunningStack(tmp / "data", env).wait_up()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def studio(gpu_stack) -> StudioClient:
    return StudioClient.signed_up(gpu_stack.url)
