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
def small_model() -> str:
    """The built-in SmolLM2 when its package is here; on the GPU machine before the second call of
    a lease has carried its second part (docs/device-runs.md), random weights of its shape with its
    tokenizer, saved where the studio may read them (what these tests check is the GPU path, not
    what the weights know)."""
    from lanner.core.default_model import DEFAULT_MODEL_ID, DefaultModelMissing, gguf_path

    try:
        gguf_path()
        return DEFAULT_MODEL_ID
    except DefaultModelMissing:
        pass
    target = MODELS / "smollm2-shape-random"
    if not (target / "model.safetensors").exists():
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        source = os.environ["LANNER_TEST_TOKENIZER_DIR"]  # the bundle's SmolLM2 tokenizer and config
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source)).save_pretrained(target)
        AutoTokenizer.from_pretrained(source).save_pretrained(target)
    print(f"built-in model not on this machine: random weights of its shape at {target}")
    return str(target)


@pytest.fixture(scope="session")
def studio(gpu_stack) -> StudioClient:
    return StudioClient.signed_up(gpu_stack.url)
