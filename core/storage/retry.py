"""Retrying a store operation while the store is unreachable (a restart, a network cut): waits that
double up to half a minute, for at most LANNER_STORE_RETRY_S in all; each wait is said in words to
`on_wait` (a job's log, the API's log), so a job that waits for its store says so."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from lanner.core.storage.base import StoreUnavailable

T = TypeVar("T")
FIRST_WAIT_S = 1.0
LONGEST_WAIT_S = 30.0

log = logging.getLogger("lanner.storage")


def log_wait(message: str) -> None:
    log.warning(message)


def with_retry(action: Callable[[], T], what: str, limit_s: float, transient: Callable[[BaseException], bool],
               on_wait: Callable[[str], None] = log_wait) -> T:
    """action(), tried again after each transient failure until `limit_s` seconds have passed, then
    StoreUnavailable; any other failure is raised at once."""
    deadline = time.monotonic() + limit_s
    wait = FIRST_WAIT_S
    while True:
        try:
            return action()
        except Exception as error:
            if not transient(error):
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise StoreUnavailable(f"The store could not be reached for {limit_s:.0f} s while {what}; "
                                       f"gave up: {error}") from error
            pause = min(wait, left)
            on_wait(f"The store is unreachable while {what} ({error}); trying again in {pause:.0f} s, "
                    f"for {left:.0f} s more at most")
            time.sleep(pause)
            wait = min(wait * 2, LONGEST_WAIT_S)
