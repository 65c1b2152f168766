"""Types shared by the routers."""
from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

# Ids fit PostgreSQL's 32-bit integer keys; a bigger number is a 422, not a driver overflow.
MAX_ID = 2**31 - 1
PathId = Annotated[int, Path(ge=1, le=MAX_ID)]
QueryId = Annotated[int | None, Query(ge=1, le=MAX_ID)]
Offset = Annotated[int, Query(ge=0, le=MAX_ID)]
