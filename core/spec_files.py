"""Job specs as files: a spec written as YAML or as a command line, and YAML read back, Lanner's own
or an Axolotl or LLaMA-Factory training config (the fields that map; the rest listed). Pure functions:
the API (GET /api/jobs/{id}/config, POST /api/jobs/config/parse) and the `lanner` CLI call them."""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import yaml
from pydantic import ValidationError

from lanner.core import strict_json
from lanner.core.spec import SPEC_VERSION, JobSpec, Tracker

# Limits on a YAML file: its size, how deep it nests, and how many values it holds once every
# alias is expanded (a "billion laughs" file is a few lines whose aliases expand to billions).
MAX_YAML_BYTES = 256 * 1024
MAX_YAML_DEPTH = 32
MAX_YAML_NODES = 20_000
Source = Literal["lanner", "axolotl", "llama-factory"]
SOURCES: tuple[str, ...] = ("lanner", "axolotl", "llama-factory")
# A stand-in for a spec read without a dataset (an imported file, a CLI run that uploads one): the
# spec is validated with it, and it is taken out again.
_NO_DATASET = 2**31 - 1
DATASET_NOTE = ("The file names its data ({}); a job trains on a dataset uploaded to the studio: pick one "
                "(lanner train/submit: --dataset FILE).")


class SpecFileError(ValueError):
    """A file that cannot be read as a spec, in words."""


@dataclass
class ParsedSpec:
    source: Source
    spec: dict[str, Any]                                  # the fields read, not yet validated
    unmapped: list[str] = field(default_factory=list)     # keys of the file that became nothing
    notes: list[str] = field(default_factory=list)        # what the person has to know or do


def dump_yaml(spec: dict[str, Any]) -> str:
    """A spec (as JobSpec.model_dump(mode="json") or a job's shown config) as a Lanner YAML file."""
    header = (f"# Lanner job spec (docs/job-spec.md). Queue it: lanner submit FILE --url URL --token TOKEN\n"
              f"# Run it here: lanner train FILE --dataset DATA.jsonl --out DIR\n")
    return header + yaml.safe_dump({"version": SPEC_VERSION, **spec}, sort_keys=False, allow_unicode=True)


def command_line(spec: dict[str, Any], url: str, file_name: str) -> str:
    """A shell command that queues the spec again on the studio at `url`: the YAML file written by a
    here-document, then `lanner submit` on it (the token from $LANNER_TOKEN)."""
    body = dump_yaml({key: value for key, value in spec.items() if key != "dataset_id"})
    name = shlex.quote(file_name)
    submit = f"lanner submit {name} --url {shlex.quote(url)} --token \"$LANNER_TOKEN\""
    if spec.get("dataset_id") is not None:
        submit += f" --dataset-id {int(spec['dataset_id'])}"
    return f"cat > {name} <<'LANNER_SPEC'\n{body}LANNER_SPEC\n{submit}\n"


class _SpecLoader(yaml.SafeLoader):
    """yaml.SafeLoader without !!binary, whose bytes no spec field takes and no answer can carry (they
    need not be UTF-8): such a value is refused as any other unknown tag is."""


_SpecLoader.yaml_constructors = {tag: constructor for tag, constructor in yaml.SafeLoader.yaml_constructors.items()
                                 if tag != "tag:yaml.org,2002:binary"}


def load_yaml(text: str | bytes) -> Any:
    """yaml.safe_load within the limits above; SpecFileError in words for anything else."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise SpecFileError("The file is not UTF-8 text.") from None
    if len(text.encode("utf-8")) > MAX_YAML_BYTES:
        raise SpecFileError(f"The file is over {MAX_YAML_BYTES // 1024} KiB; a job spec is a few hundred bytes.")
    loader = None
    try:
        loader = _SpecLoader(text)  # refuses control characters here
        node = loader.get_single_node()
        if node is None:
            raise SpecFileError("The file is empty.")
        _check_size(node)
        data = loader.construct_document(node)
    except yaml.YAMLError as error:
        raise SpecFileError(f"The file is not valid YAML: {error}") from None
    except SpecFileError:
        raise
    except ValueError as error:  # an integer of more digits than Python converts
        raise SpecFileError(f"The file holds a value that cannot be read: {error}") from None
    except RecursionError:
        raise SpecFileError(f"The file nests deeper than {MAX_YAML_DEPTH} levels.") from None
    finally:
        if loader is not None:
            loader.dispose()
    try:  # YAML's escapes make a NUL (\0) or a lone surrogate (\ud800), as JSON's do
        strict_json.check_strings(data)
    except strict_json.UnstorableJson as error:
        raise SpecFileError(f"{error}.") from None
    return data


def _check_size(root: yaml.Node) -> None:
    """Counts the values with aliases expanded, stopping at the limits: the count stays cheap for a file
    whose expansion would not fit in memory, and a node that holds itself hits the depth limit."""
    count = 0
    stack: list[tuple[yaml.Node, int]] = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_YAML_NODES:
            raise SpecFileError(f"The file holds more than {MAX_YAML_NODES} values once its aliases (*name) are "
                                "expanded; a job spec holds a few dozen.")
        if depth > MAX_YAML_DEPTH:
            raise SpecFileError(f"The file nests deeper than {MAX_YAML_DEPTH} levels.")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            stack.extend((part, depth + 1) for pair in node.value for part in pair)


def parse(text: str | bytes, source: str = "auto") -> ParsedSpec:
    """A YAML file read as a spec of `source` ("auto": told by its keys)."""
    data = load_yaml(text)
    if not isinstance(data, dict) or not all(isinstance(key, str) for key in data):
        raise SpecFileError("The file must be a YAML mapping of field names to values (method: lora, ...).")
    if source == "auto":
        source = detect_source(data)
    if source == "lanner":
        return _lanner(data)
    if source == "axolotl":
        return import_axolotl(data)
    if source == "llama-factory":
        return import_llama_factory(data)
    raise SpecFileError(f"Unknown source {source!r}: give one of auto, {', '.join(SOURCES)}.")


def detect_source(data: dict[str, Any]) -> Source:
    if "base_model" in data or {"adapter", "micro_batch_size", "sequence_len", "num_epochs"} & set(data):
        return "axolotl"
    if "model_name_or_path" in data or {"finetuning_type", "stage", "cutoff_len", "lora_rank"} & set(data):
        return "llama-factory"
    return "lanner"


def _lanner(data: dict[str, Any]) -> ParsedSpec:
    data = dict(data)
    version = data.pop("version", SPEC_VERSION)
    if version != SPEC_VERSION:
        raise SpecFileError(f"The file is a version {version!r} spec; this Lanner reads version {SPEC_VERSION}.")
    return ParsedSpec("lanner", data)


def validate(parsed: ParsedSpec, dataset_id: int | None = None) -> tuple[dict[str, Any] | None, list[dict]]:
    """The spec validated, as the API would store it, and no errors; or None and the errors in the
    shape of the API's 422s ({"loc": ["body", field, ...], "msg", "type"}). A spec without a dataset
    (none given, none in the file) is validated without one and comes back without one."""
    given = {**parsed.spec, **({"dataset_id": dataset_id} if dataset_id is not None else {})}
    missing_dataset = "dataset_id" not in given
    try:
        spec = JobSpec.model_validate({**given, "dataset_id": _NO_DATASET} if missing_dataset else given)
    except ValidationError as error:
        return None, [{"loc": ["body", *error_item["loc"]], "msg": error_item["msg"], "type": error_item["type"]}
                      for error_item in error.errors(include_url=False)]
    dumped = spec.model_dump(mode="json")
    if missing_dataset:
        dumped.pop("dataset_id")
    return dumped, []


class _Mapper:
    """Moves the keys of a foreign config into a spec, remembering which were used."""

    def __init__(self, data: dict[str, Any]):
        self.data, self.used, self.spec, self.notes = data, set(), {}, []

    def take(self, key: str) -> Any:
        self.used.add(key)
        return self.data.get(key)

    def put(self, key: str, where: str, convert=lambda value: value) -> None:
        """`key`'s value, converted, at `where` (a dotted path), when the file gives one."""
        value = self.take(key)
        if value is None:
            return
        value = convert(value)
        if value is None:
            self.used.discard(key)  # a value that means nothing here: listed as not mapped
            return
        *parents, last = where.split(".")
        target = self.spec
        for parent in parents:
            target = target.setdefault(parent, {})
        target[last] = value

    def result(self, source: Source, dataset_keys: tuple[str, ...]) -> ParsedSpec:
        data_named = [f"{key}: {_short(self.data[key])}" for key in dataset_keys if self.data.get(key) is not None]
        if data_named:
            self.used.update(dataset_keys)
            self.notes.append(DATASET_NOTE.format("; ".join(data_named)))
        unmapped = sorted(key for key in self.data if key not in self.used)
        return ParsedSpec(source, self.spec, unmapped, self.notes)


def _short(value: Any, limit: int = 120) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _precision(bf16: Any, fp16: Any) -> str | None:
    if bf16 is True:
        return "bf16"
    if fp16 is True:
        return "fp16"
    if bf16 == "auto" or fp16 == "auto":
        return "auto"
    return None


SCHEDULERS = {"linear", "cosine", "constant", "constant_with_warmup"}


def _scheduler(value: Any) -> str | None:
    return value if value in SCHEDULERS else None


def _positive(value: Any) -> Any:
    """HF's "no limit" (-1, 0) reads as the field left out."""
    return value if not isinstance(value, (int, float)) or value > 0 else None


def _fraction(value: Any) -> Any:
    """A validation split given as a share; a row count has no field here."""
    return value if isinstance(value, float) and 0 <= value < 1 else None


def import_axolotl(data: dict[str, Any]) -> ParsedSpec:
    """An Axolotl config (https://docs.axolotl.ai/docs/config-reference.html)."""
    mapper = _Mapper(data)
    adapter, rl = mapper.take("adapter"), mapper.take("rl")
    mapper.take("load_in_4bit"), mapper.take("load_in_8bit")
    if rl in ("dpo", "orpo", "kto"):
        mapper.spec["method"] = rl
        if adapter not in (None, "lora"):
            mapper.notes.append(f"adapter {adapter} with rl {rl}: a preference method trains a LoRA adapter in "
                                "16 bits here; mapped to a LoRA adapter")
    elif rl is not None:
        mapper.used.discard("rl")
        mapper.notes.append(f"rl {rl}: not a Lanner method (dpo, orpo, kto); set method yourself")
    elif adapter in ("lora", "qlora"):
        mapper.spec["method"] = "qlora" if adapter == "qlora" or data.get("load_in_4bit") is True else "lora"
    elif adapter is None:
        mapper.spec["method"] = "full"
    else:
        mapper.used.discard("adapter")
        mapper.notes.append(f"adapter {adapter}: not a Lanner method; set method yourself")
    mapper.put("base_model", "model")
    if adapter is not None:
        mapper.put("lora_r", "lora.rank")
        mapper.put("lora_alpha", "lora.alpha")
        mapper.put("lora_dropout", "lora.dropout")
        if mapper.take("lora_target_linear") is True:
            mapper.spec.setdefault("lora", {})["target_modules"] = "all-linear"
        else:
            mapper.used.discard("lora_target_linear")
            mapper.put("lora_target_modules", "lora.target_modules")
    mapper.put("learning_rate", "hyperparameters.learning_rate")
    mapper.put("num_epochs", "hyperparameters.epochs")
    mapper.put("max_steps", "hyperparameters.max_steps", _positive)
    mapper.put("micro_batch_size", "hyperparameters.batch_size")
    mapper.put("gradient_accumulation_steps", "hyperparameters.gradient_accumulation")
    mapper.put("sequence_len", "hyperparameters.max_seq_len")
    mapper.put("warmup_ratio", "hyperparameters.warmup_ratio")
    mapper.put("lr_scheduler", "hyperparameters.lr_scheduler", _scheduler)
    mapper.put("weight_decay", "hyperparameters.weight_decay")
    mapper.put("max_grad_norm", "hyperparameters.max_grad_norm")
    mapper.put("seed", "hyperparameters.seed")
    mapper.put("save_steps", "hyperparameters.save_steps")
    mapper.put("eval_steps", "hyperparameters.eval_steps", _positive)
    mapper.put("val_set_size", "hyperparameters.eval_fraction", _fraction)
    mapper.put("gradient_checkpointing", "hyperparameters.gradient_checkpointing",
               lambda value: value if isinstance(value, bool) else None)
    mapper.put("sample_packing", "hyperparameters.packing")
    mapper.put("train_on_inputs", "hyperparameters.completion_only_loss",
               lambda value: not value if isinstance(value, bool) else None)
    precision = _precision(mapper.take("bf16"), mapper.take("fp16"))
    if precision:
        mapper.spec.setdefault("hyperparameters", {})["precision"] = precision
    else:
        mapper.used.difference_update({"bf16", "fp16"})
    beta = next((key for key in ("rl_beta", "dpo_beta", "orpo_alpha") if data.get(key) is not None), None)
    if beta and mapper.spec.get("method") in ("dpo", "orpo", "kto"):
        mapper.put(beta, "preference.beta")
    mapper.put("chat_template_jinja", "chat_template")
    trackers = {"wandb_project": "wandb", "use_tensorboard": "tensorboard", "mlflow_tracking_uri": "mlflow"}
    _add_trackers(mapper, [name for key, name in trackers.items() if mapper.take(key)])
    mapper.used.difference_update(key for key in trackers if not data.get(key))
    if data.get("chat_template") is not None:
        mapper.notes.append(f"chat_template {_short(data['chat_template'])}: Axolotl names a template; Lanner "
                            "takes the model's own, or a Jinja template (chat_template_jinja)")
    return mapper.result("axolotl", ("datasets", "test_datasets", "pretraining_dataset"))


TRACKER_NOTES = {"wandb": "W&B: Lanner keeps an offline run with the job (`wandb sync` uploads it)",
                 "mlflow": "MLflow: Lanner logs to the studio's tracking server, which an admin sets up"}


def _add_trackers(mapper: _Mapper, found: list[str]) -> None:
    if not found:
        return
    trackers = mapper.spec.setdefault("trackers", [])
    for name in found:
        if name not in trackers:
            trackers.append(name)
            if name in TRACKER_NOTES:
                mapper.notes.append(TRACKER_NOTES[name])


def _report_to(mapper: _Mapper) -> None:
    """Transformers' report_to: the trackers Lanner has, "none" as none; any other name (or "all",
    which means whatever is installed) is listed as not mapped."""
    value = mapper.take("report_to")
    names = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    known = [name for name in names if name in get_args(Tracker)]
    if value is None or names == ["none"]:
        return
    if len(known) != len(names):
        mapper.used.discard("report_to")
    _add_trackers(mapper, known)


def _lora_target(value: Any) -> Any:
    if value == "all":
        return "all-linear"
    if isinstance(value, str):
        return [name.strip() for name in value.split(",") if name.strip()]
    return value


def import_llama_factory(data: dict[str, Any]) -> ParsedSpec:
    """A LLaMA-Factory training config (examples/train_*/*.yaml in its repository)."""
    mapper = _Mapper(data)
    stage, finetuning = mapper.take("stage") or "sft", mapper.take("finetuning_type") or "lora"
    quantised = mapper.take("quantization_bit") == 4
    adapter = finetuning == "lora"
    if finetuning not in ("lora", "full"):
        mapper.used.discard("finetuning_type")
        mapper.notes.append(f"finetuning_type {finetuning}: Lanner trains a LoRA adapter or every weight; "
                            "mapped to full")
    if stage == "sft":
        mapper.spec["method"] = ("qlora" if quantised else "lora") if adapter else "full"
    elif stage == "pt":
        mapper.spec["method"] = "pretrain"
        if adapter:
            adapter = False
            mapper.notes.append("stage pt with LoRA: Lanner pretrains every weight; mapped to pretrain, without "
                                "the LoRA settings")
    elif stage == "rm":
        mapper.spec["method"] = "reward"
    elif stage in ("dpo", "kto"):
        loss = mapper.take("pref_loss")
        mapper.spec["method"] = "orpo" if stage == "dpo" and loss == "orpo" else stage
        if loss not in (None, "sigmoid", "orpo"):
            mapper.used.discard("pref_loss")
    else:
        mapper.used.discard("stage")
        mapper.notes.append(f"stage {stage}: not a Lanner method (sft, pt, rm, dpo, kto); set method yourself")
    if quantised and mapper.spec.get("method") != "qlora":
        mapper.used.discard("quantization_bit")
    mapper.put("model_name_or_path", "model")
    if adapter:
        mapper.put("lora_rank", "lora.rank")
        mapper.put("lora_alpha", "lora.alpha")
        mapper.put("lora_dropout", "lora.dropout")
        mapper.put("lora_target", "lora.target_modules", _lora_target)
    mapper.put("learning_rate", "hyperparameters.learning_rate")
    mapper.put("num_train_epochs", "hyperparameters.epochs")
    mapper.put("max_steps", "hyperparameters.max_steps", _positive)
    mapper.put("per_device_train_batch_size", "hyperparameters.batch_size")
    mapper.put("gradient_accumulation_steps", "hyperparameters.gradient_accumulation")
    mapper.put("cutoff_len", "hyperparameters.max_seq_len")
    mapper.put("warmup_ratio", "hyperparameters.warmup_ratio")
    mapper.put("lr_scheduler_type", "hyperparameters.lr_scheduler", _scheduler)
    mapper.put("weight_decay", "hyperparameters.weight_decay")
    mapper.put("max_grad_norm", "hyperparameters.max_grad_norm")
    mapper.put("seed", "hyperparameters.seed")
    mapper.put("save_steps", "hyperparameters.save_steps")
    mapper.put("eval_steps", "hyperparameters.eval_steps", _positive)
    mapper.put("val_size", "hyperparameters.eval_fraction", _fraction)
    mapper.put("disable_gradient_checkpointing", "hyperparameters.gradient_checkpointing",
               lambda value: not value if isinstance(value, bool) else None)
    packing = mapper.take("packing") or mapper.take("neat_packing")
    mapper.used.add("neat_packing")
    if isinstance(packing, bool):
        mapper.spec.setdefault("hyperparameters", {})["packing"] = packing
    mapper.put("train_on_prompt", "hyperparameters.completion_only_loss",
               lambda value: not value if isinstance(value, bool) else None)
    precision = _precision(mapper.take("bf16"), mapper.take("fp16"))
    if precision:
        mapper.spec.setdefault("hyperparameters", {})["precision"] = precision
    else:
        mapper.used.difference_update({"bf16", "fp16"})
    if mapper.spec.get("method") in ("dpo", "orpo", "kto"):
        mapper.put("pref_beta", "preference.beta")
    _report_to(mapper)
    if data.get("template") is not None:
        mapper.notes.append(f"template {_short(data['template'])}: LLaMA-Factory names a chat template; Lanner "
                            "uses the model's own unless the spec gives a Jinja chat_template")
    return mapper.result("llama-factory", ("dataset", "eval_dataset", "dataset_dir"))
