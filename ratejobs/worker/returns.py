"""Giving in-flight leases back as soon as their responses are in, many in one round trip.

On an API with an in-flight cap a place is free again only once its lease is back in Redis.
Returned with the outcomes, a lease would stay out while the recorder writes them (tens of
milliseconds), and returned by each call thread, it would cost a round trip per call. One
thread returns whatever has ended since its last round trip: under load a round trip carries
many leases, and a lease waits at most for the round trip before it (group commit). Each
release wakes a caller waiting for a place at once (release.lua's wake-ups).
"""

from __future__ import annotations

import logging
import queue
import threading

from ratejobs.services.calls import LeaseReturn, calls_return_leases

logger = logging.getLogger(__name__)

_STOP = object()


class LeaseReturns:
    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._return_forever, name="ratejobs-leases", daemon=True
        )
        self._thread.start()

    def put(self, item: LeaseReturn) -> None:
        self._queue.put(item)

    def stop(self, timeout: float) -> bool:
        """Return what is queued, then stop; False if that took longer than `timeout` (the
        leases left expire by themselves)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _return_forever(self) -> None:
        stopping = False
        while not stopping:
            batch: list[LeaseReturn] = []
            item = self._queue.get()
            while True:
                if item is _STOP:
                    stopping = True
                else:
                    batch.append(item)
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            try:
                calls_return_leases(batch)
            except Exception:  # a lease not returned expires by itself
                logger.exception("could not return %d leases", len(batch))
