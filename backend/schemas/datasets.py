"""Datasets and their validation reports."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lanner.backend.schemas.common import UtcDateTime


NumberedBy = Literal["line", "row"]
LINE = ("The line of the file the row starts on (1-based); with numbered_by 'row', the row's place in the file "
        "(parquet, or a JSON list with several rows on one line)")


class BadRow(BaseModel):
    line: int = Field(description=LINE)
    reason: str = Field(description="Every problem of the row, '; ' apart; 'blank line' for a blank one")


class RowWarning(BaseModel):
    line: int = Field(description=LINE)
    message: str


class DatasetReport(BaseModel):
    """What the upload found; stored with the dataset."""
    model_config = ConfigDict(extra="allow")

    format: str | None = Field(description="messages, sharegpt, alpaca, prompt_completion, text, preference, kto, …")
    task: str | None = None
    numbered_by: NumberedBy = Field(default="line", description="What `line` counts: file lines, or rows by their "
                                                                "place (parquet; a JSON list with rows sharing lines)")
    rows: int = Field(description="Every row of the file (blank lines included): usable_rows + bad_row_count")
    usable_rows: int
    bad_rows: list[BadRow] = Field(description="The first bad rows, each with its line and reason")
    bad_row_count: int = 0
    warnings: list[RowWarning] = Field(default=[], description="The first warnings of usable rows (keys ignored)")
    warning_count: int = 0
    notes: list[str] = Field(default=[], description="How the file was read, when not as its extension says")
    columns: list[str] = []
    error: str | None = Field(default=None, description="Why the file as a whole cannot be used")
    token_stats: TokenStats | None = Field(default=None, description="Token lengths for the model the upload named")
    token_stats_error: str | None = Field(default=None, description="Why there are no token statistics")
    token_stats_waiting_for: str | None = Field(
        default=None, description="The model whose tokenizer was not on this machine at the upload (the built-in "
                                  "one still being imported): the statistics are measured when it is there")


class DatasetOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    owner_id: int
    name: str
    filename: str
    size_bytes: int
    format: str | None
    rows: int
    usable_rows: int
    report: DatasetReport
    created_at: UtcDateTime


class DatasetPage(BaseModel):
    items: list[DatasetOut]
    total: int
    offset: int
    limit: int


class UsageOut(BaseModel):
    used_bytes: int
    quota_bytes: int
    max_upload_bytes: int


class Segment(BaseModel):
    text: str
    trained: bool = Field(description="True for the tokens the loss is computed on")


class PreviewSequence(BaseModel):
    line: int = Field(description=LINE)
    sequence: Literal["text", "completion", "chosen", "rejected", "prompt"]  # prompt: GRPO's, answered by the model
    tokens: int = Field(description="Tokens of the whole rendered sequence")
    trained_tokens: int = Field(description="Trained tokens within max_seq_len")
    truncated: bool = Field(description="Longer than max_seq_len: the tail is cut off in training")
    segments: list[Segment] = Field(description="The rendered text up to max_seq_len, in runs of trained or not")
    refused: str | None = Field(default=None, description="Why the model's chat template refuses the row (a job "
                                                          "leaves it out); it then has no tokens or segments")


class DatasetPreview(BaseModel):
    model: str
    task: str = Field(description="sft, text, preference or kto: how the trainer reads the rows")
    numbered_by: NumberedBy
    offset: int = Field(description="Usable rows skipped before these")
    total: int = Field(description="Usable rows in the dataset")
    rows: list[PreviewSequence] = Field(description="Each shown row's sequences (a preference row has two)")


class TokenStats(BaseModel):
    model: str
    task: str
    rows_measured: int = Field(description="Rows measured (the first 2000)")
    sequences: int = Field(description="Rendered sequences (a preference row gives two)")
    rows_total: int | None = None
    min: int | None = None
    max: int | None = None
    mean: float | None = None
    p50: int | None = None
    p95: int | None = None
    total_tokens: int | None = None
    trained_tokens: int | None = Field(default=None, description="Tokens the loss sees, after truncation")
    max_seq_len: int | None = None
    over_max_seq_len: int | None = Field(default=None, description="Sequences longer than max_seq_len")
    refused: int | None = Field(default=None, description="Sequences the model's chat template refuses (a job leaves "
                                                         "them out), not in the figures above")
    lengths: list[int] | None = Field(default=None, description="Every measured sequence's length, sorted "
                                                                "(for a histogram; not kept in upload reports)")


DatasetReport.model_rebuild()
DatasetOut.model_rebuild()
