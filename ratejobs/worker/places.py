"""Calls of an API with an in-flight cap waiting in a worker process for a free place.

A claim reserves what places are free (calls_reserve_slots); the rest of its calls wait here,
not on threads of their own. One thread per limiter waits for a release (the wake-up
release.lua pushes), takes as many places as there are calls waiting in one round trip
(acquire_many) and starts those calls. A thread per waiting call would each wake at a release,
ask Redis in turn and mostly find the place gone: in bench-jobs' capped row such threads spent
more time asking for places than the calls spent on the wire, on a CPU they shared with them.
A call that waits longer than RATEJOBS_MAX_WORKER_WAIT starts without a place, asks on its own
and records that none came (an attempt of kind "wait"), as before.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from ratejobs.limiter import Limiter, LimiterError
from ratejobs.limiter.core import MAX_BATCH
from ratejobs.services.calls import Claimed

logger = logging.getLogger(__name__)


class _Waiting:
    """The calls of one limiter waiting for places, in the order they came, and its thread."""

    def __init__(self, limiter: Limiter) -> None:
        self.limiter = limiter
        self.calls: deque[tuple[float, Claimed]] = deque()  # (monotonic deadline, call)
        self.thread: threading.Thread | None = None


class PlaceQueue:
    def __init__(self, start: Callable[[Claimed], None], *, max_wait: float) -> None:
        self._start = start
        self._max_wait = max_wait
        self._lock = threading.Condition()
        self._waiting: dict[str, _Waiting] = {}

    def add(self, item: Claimed) -> None:
        """Queue a claimed call without a place; it starts (self._start) once it has one, or
        without one after max_wait."""
        limiter = item.context.limiter
        with self._lock:
            waiting = self._waiting.get(limiter.name)
            if waiting is None:
                waiting = self._waiting[limiter.name] = _Waiting(limiter)
            waiting.calls.append((time.monotonic() + self._max_wait, item))
            if waiting.thread is None:
                waiting.thread = threading.Thread(
                    target=self._serve, args=(waiting,), name="ratejobs-places", daemon=True
                )
                waiting.thread.start()
            self._lock.notify_all()

    def _serve(self, waiting: _Waiting) -> None:
        """Hand out places to the limiter's waiting calls until none is left."""
        while True:
            with self._lock:
                if not waiting.calls:
                    waiting.thread = None
                    return
                batch = [item for _, item in waiting.calls]
            granted, at_capacity = self._take_places(waiting.limiter, batch)
            with self._lock:
                for grant in granted:
                    _, item = waiting.calls.popleft()
                    self._start(item if grant is None else replace(item, reserved=grant))
                now = time.monotonic()
                while waiting.calls and waiting.calls[0][0] <= now:
                    # waited its worker wait: it asks on its own, and records that none came
                    self._start(waiting.calls.popleft()[1])
                if not waiting.calls:
                    continue
                first_deadline = waiting.calls[0][0]
            if len(granted) < len(batch):
                left = max(0.0, first_deadline - time.monotonic())
                if at_capacity:
                    self._await_release(waiting.limiter, left)
                else:  # the next slot is beyond the wait: the calls time out on their own
                    time.sleep(min(left, 0.05))

    def _take_places(self, limiter: Limiter, batch: list[Claimed]) -> tuple[list, bool]:
        first = batch[0]
        try:
            grants = limiter.acquire_many(
                min(len(batch), MAX_BATCH),
                costs=[item.call.cost for item in batch[:MAX_BATCH]],
                max_wait=self._max_wait,
                lease_seconds=first.context.policy.lease_seconds,
                wait_for_room=False,
            )
        except LimiterError as exc:
            # each call asks on its own (and records why it could not) once its wait is over
            logger.warning("limiter %r: could not take places: %s", limiter.name, exc)
            time.sleep(0.05)
            return [], False
        except Exception:  # a cost no window can ever hold, say: each call meets it on its own
            logger.exception("limiter %r: could not take places", limiter.name)
            return [None] * len(batch), False
        return list(grants), grants.at_capacity

    def _await_release(self, limiter: Limiter, timeout: float) -> None:
        try:
            limiter.await_release(timeout)
        except LimiterError:
            time.sleep(min(timeout, 0.05))
