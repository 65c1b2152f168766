"""What `lanner train`, `submit` and `export` share: a config file read as a validated spec, and a
job's events in the terminal, a progress bar of the steps (or an export's stages) and one line for
every other event."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from lanner.core.spec_files import SpecFileError, parse, validate


def read_spec(config: Path, dataset_id: int | None) -> dict:
    """The config file's spec, validated as the API would; SystemExit in words otherwise. What an
    imported file left out is said."""
    try:
        parsed = parse(config.read_bytes())
    except (OSError, SpecFileError) as error:
        raise SystemExit(f"{config}: {error}") from None
    if parsed.source != "lanner":
        print(f"{config}: read as {parsed.source} config" + (
            f"; not mapped: {', '.join(parsed.unmapped)}" if parsed.unmapped else ""))
    for note in parsed.notes:
        print(f"{config}: {note}")
    spec, problems = validate(parsed, dataset_id)
    if problems:
        raise SystemExit(f"{config} is not a valid job spec:\n" + "\n".join(
            f"  {'.'.join(str(part) for part in problem['loc'][1:])}: {problem['msg']}" for problem in problems))
    return spec


class EventPrinter:
    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.bar: tqdm | None = None

    def show(self, kind: str, data: dict[str, Any]) -> None:
        """One event as the job's stream holds it: its type and data."""
        if kind == "metric":
            self._step(data)
        elif kind == "progress":
            self._bar(1000, "export").update(round(data["fraction"] * 1000) - self.bar.n)
            self.bar.set_postfix_str(data["stage"])
        elif kind == "log":
            self.line(f"[{data['level']}] {data['message']}")
        elif kind == "status":
            self.line(f"status: {data['status']}" + (f": {data['error']}" if data.get("error") else ""))
        elif kind == "dataset":
            self.line(f"dataset: {data.get('format')}, {data.get('usable_rows', data.get('rows'))} usable rows")
        elif kind == "checkpoint":
            self.line(f"checkpoint {data['name']} at step {data['step']}")
        elif kind != "device":  # device samples would flood the terminal; the bar is the live view
            self.line(f"{kind}: {json.dumps(data)[:500]}")

    def _bar(self, total: int, unit: str) -> tqdm:
        if self.bar is None or self.bar.total != total:
            self.close()
            self.bar = tqdm(total=total, unit=unit, file=self.stream, dynamic_ncols=True)
        return self.bar

    def _step(self, data: dict[str, Any]) -> None:
        if "loss" not in data:  # an evaluation's values
            self.line(f"step {data['step']}: " + ", ".join(f"{k} {v:.4g}" for k, v in data.items()
                                                            if k.startswith("eval_") and isinstance(v, float)))
            return
        bar = self._bar(data.get("total_steps") or data["step"], "step")
        bar.update(data["step"] - bar.n)
        bar.set_postfix(loss=f"{data['loss']:.4f}")

    def line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
