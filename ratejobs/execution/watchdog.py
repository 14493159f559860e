"""The total timeout of one send(), kept whatever the exchange is doing: socket timeouts count
per read, so only shutting the sockets down bounds the whole of it."""

from __future__ import annotations

import contextlib
import heapq
import os
import socket
import threading
import time
from collections.abc import Iterator


class Watchdog:
    """Shuts down the sockets of one send() once its total timeout passes, whatever the send
    is doing: connecting, the TLS handshake, the status line, headers or body. Socket timeouts
    count per read, so a server that trickles a byte within each would hold the worker (and
    its limiter lease) for as long as it likes.

    It shuts down its own duplicates of the sockets (same connection, other descriptors): a
    descriptor closed and reused meanwhile can never be hit, and the duplicates are closed when
    the send ends."""

    def __init__(self, seconds: float) -> None:
        self.fired = False
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._stopped = False
        self._seconds = seconds

    def start(self) -> None:
        _deadlines.add(time.monotonic() + self._seconds, self)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def watch(self, sock: socket.socket) -> None:
        try:
            copy = socket.socket(fileno=os.dup(sock.fileno()))
        except OSError:  # already closed: nothing left to interrupt
            return
        with self._lock:
            if not self._stopped:
                self._sockets.append(copy)
                if self.fired:
                    _shut(copy)
                return
        copy.close()

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            for sock in self._sockets:
                sock.close()
            self._sockets.clear()

    def fire(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self.fired = True
            for sock in self._sockets:
                _shut(sock)


class _Deadlines:
    """One thread per process fires the watchdogs whose deadline has passed. A timer thread
    per send() would cost about 0.2 ms of CPU per call to start and stop, on the hot path.

    A stopped watchdog stays in the heap until its deadline (or a compaction) and is skipped
    then; the heap is rebuilt when stopped entries make up most of it."""

    # Below this many entries a rebuild saves nothing worth its cost.
    COMPACT_ABOVE = 1024

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._heap: list[tuple[float, int, Watchdog]] = []
        self._added = 0
        self._thread: threading.Thread | None = None

    def add(self, deadline: float, dog: Watchdog) -> None:
        with self._ready:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="send deadlines",
                                                daemon=True)  # fmt: skip
                self._thread.start()
            if len(self._heap) > self.COMPACT_ABOVE:
                live = [entry for entry in self._heap if not entry[2].stopped]
                if len(live) < len(self._heap) // 2:
                    heapq.heapify(live)
                    self._heap = live
            self._added += 1
            heapq.heappush(self._heap, (deadline, self._added, dog))
            if self._heap[0][2] is dog:  # earlier than what the thread sleeps towards
                self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    self._ready.wait(self._heap[0][0] - time.monotonic() if self._heap else None)
                _, _, dog = heapq.heappop(self._heap)
            if not dog.stopped:
                dog.fire()


_deadlines = _Deadlines()


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


# The watchdog of the send() running on this thread: urllib3 connects and reads on the
# caller's thread, and its connection objects reach it here without new arguments.
_current = threading.local()


@contextlib.contextmanager
def watched(seconds: float | None) -> Iterator[Watchdog | None]:
    if seconds is None:
        yield None
        return
    dog = Watchdog(seconds)
    _current.dog = dog
    dog.start()
    try:
        yield dog
    finally:
        _current.dog = None
        dog.stop()


def current() -> Watchdog | None:
    """The watchdog of the send() running on this thread, if it has a total timeout."""
    return getattr(_current, "dog", None)


def _after_fork_in_child() -> None:
    global _deadlines
    # The deadline thread is not copied by a fork: the child starts its own.
    _deadlines = _Deadlines()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
