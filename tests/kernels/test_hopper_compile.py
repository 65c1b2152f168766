"""The Hopper build check (hopper_compile, run over every kernel launch of these tests at the session's end)
finds a kernel that runs under the interpreter but does not build for the GPU, and passes a good one."""
import os
import sys

import pytest
import torch

import hopper_compile

KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def _scaled(x, ROUND: tl.constexpr):
    if ROUND:
        return x * 2.0, tl.where(x > 0, 1.0, 0.0)
    return x * 2.0, 1.0  # a scalar here, a tensor above: the GPU front end refuses it


@triton.jit
def bad_kernel(X, OUT, n, ROUND: tl.constexpr, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + cols, mask=cols < n, other=0.0)
    y, d = _scaled(x, ROUND)
    tl.store(OUT + cols, y * d, mask=cols < n)


@triton.jit
def good_kernel(X, OUT, n, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    tl.store(OUT + cols, tl.load(X + cols, mask=cols < n, other=0.0) * 2.0, mask=cols < n)
'''


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="checks what the CPU interpreter misses")
def test_a_kernel_the_interpreter_runs_but_the_gpu_cannot_build_is_reported(tmp_path, monkeypatch):
    (tmp_path / "hopper_probe_kernels.py").write_text(KERNELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    import hopper_probe_kernels as probe

    launches = set()
    with pytest.MonkeyPatch.context() as patch:
        hopper_compile.record(launches, patch)
        x, out = torch.randn(8), torch.empty(8)
        probe.bad_kernel[(1,)](x, out, 8, ROUND=True, BLOCK=8)  # runs on the CPU
        torch.testing.assert_close(out, torch.where(x > 0, x * 2, 0.0))
        probe.good_kernel[(1,)](x, out, 8, BLOCK=8)
    assert len(launches) == 2
    errors = hopper_compile.front_end_errors(launches)
    assert len(errors) == 1 and "bad_kernel" in errors[0] and "ROUND" in errors[0], errors
