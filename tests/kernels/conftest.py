import os

import pytest
import torch

from lanner.kernels.ops import _utils

import hopper_compile

# (Without a GPU TRITON_INTERPRET=1: the root conftest sets it before triton is imported.)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="session", autouse=True)
def _kernels_build_for_hopper():
    """Every kernel launch these tests made under the interpreter also builds for an H100/H200 (hopper_compile):
    checked once, at the end of the session."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    launches = set()
    with pytest.MonkeyPatch.context() as patch:
        hopper_compile.record(launches, patch)
        yield
    errors = hopper_compile.front_end_errors(launches)
    assert not errors, f"{len(errors)} of {len(launches)} kernel launches do not build for sm_90:\n" + "\n".join(errors)


@pytest.fixture(autouse=True)
def _seed_and_poison_outputs(monkeypatch):
    """Fresh deterministic random inputs per test, and NaN-filled output buffers (see _utils.POISON_OUTPUTS)."""
    torch.manual_seed(0)
    monkeypatch.setattr(_utils, "POISON_OUTPUTS", True)


@pytest.fixture
def device():
    return DEVICE


def _assert_close_scaled(actual, expected, rtol):
    """Elementwise check with an absolute floor of rtol * max|expected|: right for sums and matmul
    outputs, whose elements near zero carry the rounding error of the large terms they cancel."""
    expected = expected.to(actual.device)
    atol = rtol * expected.abs().max().item()
    torch.testing.assert_close(actual.double(), expected.double(), rtol=rtol, atol=atol)


@pytest.fixture
def assert_close_scaled():
    return _assert_close_scaled
