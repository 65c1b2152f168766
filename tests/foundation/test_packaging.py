"""One distribution, every import name under `lanner`: nothing that shadows another package."""
from __future__ import annotations

import subprocess
import sys
from importlib.metadata import distribution

from support import REPO


def test_import_names_live_under_lanner(tmp_path):
    script = (
        "import importlib.util, lanner.backend, lanner.worker, lanner.kernels, lanner.cli\n"
        "print([n for n in ('backend', 'worker', 'kernels', 'cli') if importlib.util.find_spec(n)])\n"
    )
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_distribution_declares_the_stack():
    requires = " ".join(distribution("lanner").requires or [])
    for name in ("fastapi", "sqlalchemy", "alembic", "celery", "redis", "torch", "triton", "transformers",
                 "peft", "trl", "datasets", "bitsandbytes", "nvidia-ml-py", "gguf", "llama-cpp-python", "psutil"):
        assert name in requires, name
    assert (REPO / "constraints.txt").read_text().count("==") > 50
