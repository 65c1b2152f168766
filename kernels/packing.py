"""Padding-free packing: several samples in one row, each attending only to itself.

`pack_samples` places tokenized samples into rows of at most `max_length` tokens (first fit, longest
first) and returns, per row, the tokens, the labels and position ids that restart at 0 at each
sample. Given position ids and no attention mask, transformers' masking builds a block-diagonal
causal mask for sdpa/eager/flex attention, and flash attention takes the varlen path; the RoPE
kernel rotates by each sample's own positions. The first label of each sample is -100, so no
sample's last token is trained to predict the next sample's first one: a packed row's loss is the
sum of its samples' losses, the same targets as training them one by one. Pass the batch's
`num_items_in_batch` (or average over the labels' non-ignored count) as usual.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

IGNORE_INDEX = -100


@dataclass(frozen=True)
class PackedBatch:
    input_ids: torch.Tensor  # (rows, length)
    labels: torch.Tensor  # (rows, length), IGNORE_INDEX at each sample's first token and on padding
    position_ids: torch.Tensor  # (rows, length), restarting at 0 at each sample
    samples: tuple[tuple[tuple[int, int, int], ...], ...]  # per row: (sample index, start, length)

    def as_model_inputs(self) -> dict:
        return dict(input_ids=self.input_ids, labels=self.labels, position_ids=self.position_ids)

    @property
    def real_tokens(self) -> int:
        return sum(length for row in self.samples for _, _, length in row)

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.real_tokens / self.input_ids.numel() if self.input_ids.numel() else 0.0


def padded_tokens(lengths: Sequence[int], batch_size: int) -> int:
    """Tokens a padded (unpacked) loader feeds for these sample lengths, in order, padded to each batch's longest."""
    return sum(max(lengths[i:i + batch_size]) * len(lengths[i:i + batch_size]) for i in range(0, len(lengths), batch_size))


def pack_samples(
    input_ids: Sequence[Sequence[int]],
    max_length: int,
    labels: Sequence[Sequence[int]] | None = None,
    pad_token_id: int = 0,
    pad_to: int | None = None,
) -> PackedBatch:
    """Packs tokenized samples into rows of at most max_length tokens.

    labels: per-sample labels (e.g. the prompt masked with -100), default the tokens themselves.
    Rows are padded to the longest row (or to pad_to), with padding labelled -100. A sample longer
    than max_length is an error (truncate before packing, as you would without it).
    """
    if max_length < 1:
        raise ValueError(f"pack_samples: max_length must be at least 1, got {max_length}")
    labels = input_ids if labels is None else labels
    if len(labels) != len(input_ids):
        raise ValueError(f"pack_samples: {len(input_ids)} samples but {len(labels)} label lists")
    for i, (ids, lab) in enumerate(zip(input_ids, labels)):
        if len(ids) != len(lab):
            raise ValueError(f"pack_samples: sample {i} has {len(ids)} tokens but {len(lab)} labels")
        if len(ids) > max_length:
            raise ValueError(f"pack_samples: sample {i} has {len(ids)} tokens, more than max_length={max_length}")
        if not ids:
            raise ValueError(f"pack_samples: sample {i} is empty")

    rows: list[list[int]] = []  # sample indices per row
    room: list[int] = []
    for i in sorted(range(len(input_ids)), key=lambda i: -len(input_ids[i])):
        n = len(input_ids[i])
        row = next((r for r, free in enumerate(room) if free >= n), None)
        if row is None:
            rows.append([]), room.append(max_length)
            row = len(rows) - 1
        rows[row].append(i)
        room[row] -= n

    width = max((max_length - free for free in room), default=0)
    if pad_to is not None:
        if pad_to < width:
            raise ValueError(f"pack_samples: pad_to={pad_to} is shorter than the longest row ({width})")
        width = pad_to
    ids_out = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    labels_out = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    layout = []
    for r, members in enumerate(rows):
        start, placed = 0, []
        for i in members:
            n = len(input_ids[i])
            ids_out[r, start:start + n] = torch.as_tensor(input_ids[i])
            labels_out[r, start + 1:start + n] = torch.as_tensor(labels[i][1:])
            positions[r, start:start + n] = torch.arange(n)
            placed.append((i, start, n))
            start += n
        positions[r, start:] = torch.arange(width - start)  # padding: a "sample" of its own at the end
        layout.append(tuple(placed))
    return PackedBatch(ids_out, labels_out, positions, tuple(layout))
