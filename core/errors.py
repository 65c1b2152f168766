"""The one error type a person sees: what went wrong, in words they can act on.

Services raise it; the API answers it as {"detail": message} with `status` (backend/errors.py), a
WebSocket sends it as an error message with `code`, and a worker process writes it as the job's error."""
from __future__ import annotations


class UserError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after = status, message, code, retry_after
