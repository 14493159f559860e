"""A bounded pool of threads that carries many calls at once in one process.

A Celery prefork process runs one task at a time; a task hands its calls to this pool and
returns, so the process holds up to `size` calls in flight while it takes the next message.
Room is reserved before work is claimed: a task never claims calls that would then queue
behind others in this process (their limiter wait, and so pause and cancel, stay bounded).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

logger = logging.getLogger(__name__)


class CallPool:
    def __init__(self, size: int, *, name: str = "ratejobs-call") -> None:
        if not isinstance(size, int) or size < 1:
            raise ValueError("size must be a whole number >= 1")
        self.size = size
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix=name)
        self._room = threading.Condition()
        self._busy = 0  # reserved or running

    @property
    def busy(self) -> int:
        with self._room:
            return self._busy

    def reserve(
        self,
        wanted: int,
        *,
        timeout: float | None = None,
        gather: int = 1,
        gather_seconds: float = 0.0,
    ) -> int:
        """Reserve room for up to `wanted` calls, waiting (at most `timeout` s) until there is
        room for at least one; returns how many places were reserved (0 after a timeout).

        With room for fewer than `gather` (and `wanted`), it waits up to `gather_seconds` more
        for others to free up: on a full pool, places free one by one, and claiming each call
        on its own costs a database statement per call."""
        if wanted <= 0:
            return 0
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._room:
            while self._busy >= self.size:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return 0
                self._room.wait(left)
            enough = min(wanted, gather, self.size)
            gathered_by = time.monotonic() + gather_seconds
            while self.size - self._busy < enough:
                left = gathered_by - time.monotonic()
                if left <= 0:
                    break
                self._room.wait(left)
            taken = min(wanted, self.size - self._busy)
            self._busy += taken
            return taken

    def unreserve(self, places: int) -> None:
        """Give back places reserved for calls that were not claimed after all."""
        if places > 0:
            self._free(places)

    def run(self, work: Callable[[], None]) -> None:
        """Run `work` on a reserved place; the place is free again when it returns."""

        def run_and_free() -> None:
            try:
                work()
            except Exception:  # work records its own failures; this is a last resort
                logger.exception("call thread failed")
            finally:
                self._free(1)

        self._executor.submit(run_and_free)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until nothing is reserved or running; False if `timeout` passed first."""
        deadline = time.monotonic() + timeout
        with self._room:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._room.wait(left)
            return True

    def _free(self, places: int) -> None:
        with self._room:
            self._busy -= places
            self._room.notify_all()
