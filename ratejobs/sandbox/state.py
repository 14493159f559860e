"""The sandbox's limiter, counters and arrival log behind one lock: all a request waits for."""

from __future__ import annotations

import math
import random
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ratejobs.sandbox.bucket import NS_PER_S, Bucket
from ratejobs.sandbox.config import SandboxConfig

THROTTLED = 429
ERROR = 500
CONFLICT = 409
# Stripe's header on an answer given again for a repeated key.
REPLAYED_HEADER = ("Idempotent-Replayed", "true")


class Arrival:
    """One request to the API (control endpoints are not arrivals), as the log keeps it."""

    __slots__ = (
        "key",
        "n",
        "path",
        "request_id",
        "retry_after",
        "retry_date",
        "retry_until_ns",
        "sent_ns",
        "status",
        "t_ns",
        "throttled",
    )

    def __init__(
        self,
        n: int,
        t_ns: int,
        path: str,
        status: int,
        request_id: str | None,
        key: str | None = None,
    ) -> None:
        self.n = n  # 1 for the first arrival since start or reset
        self.t_ns = t_ns  # time.monotonic_ns() on arrival, the clock the bucket decided on
        self.path = path
        self.status = status
        self.request_id = request_id
        self.key = key  # the idempotency key it carried
        self.throttled = False  # answered 429 by the limit (not a /status/429 it let through)
        self.retry_after: float | None = None  # seconds the 429's Retry-After asked for
        self.retry_date: int | None = None  # epoch of the Retry-After HTTP-date, if one
        self.sent_ns: int | None = None  # when a 429 was written to the client
        self.retry_until_ns: int | None = None  # when that 429's Retry-After ran out


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole response: what the server sends for a request, and gives again for its key."""

    status: int
    body: dict[str, Any] | bytes
    headers: tuple[tuple[str, str], ...] = ()


# Stripe answers a key whose first request is still being answered with a 409.
STILL_ANSWERING = Answer(
    CONFLICT, {"error": "a request with this idempotency key is still being answered"}
)


@dataclass(frozen=True, slots=True)
class Admission:
    """The server's answer to one arrival, and the quota numbers its headers advertise."""

    arrival: Arrival
    config: SandboxConfig  # as it was when the arrival was decided
    remaining: int  # of the advertised quota, after this request
    reset_after: float  # seconds until the advertised quota is whole again
    injected_error: bool  # answered 500 by --error-rate


class SandboxState:
    def __init__(self, config: SandboxConfig) -> None:
        self.lock = threading.Lock()
        self.config = config
        # Log times are monotonic; reports give them as epoch seconds on this one offset, so
        # they stay ordered and comparable even if the wall clock is stepped meanwhile.
        self.epoch_offset = time.time() - time.monotonic_ns() / NS_PER_S
        self._enforced = Bucket(config.enforced_rate, config.period, config.burst)
        self._advertised = Bucket(config.rate, config.period, config.burst)
        self._clear()

    def _clear(self) -> None:
        self._enforced.clear()
        self._advertised.clear()
        # Injected errors drawn from a seeded generator, reproducible by design: not a secret.
        self._rng = random.Random(self.config.seed)  # noqa: S311
        self._statuses: Counter[int] = Counter()
        self._arrivals = 0
        self._throttled = 0
        self._log: deque[Arrival] = deque(maxlen=self.config.max_log)
        # Answers by idempotency key, oldest first, each ready to be given again; and the keys
        # whose first request is being answered now.
        self._answers: OrderedDict[str, Answer] = OrderedDict()
        self._answering: set[str] = set()
        self._replays = 0
        self._conflicts = 0
        self._unique_keys = 0

    def epoch(self, t_ns: int) -> float:
        return self.epoch_offset + t_ns / NS_PER_S

    def begin_key(self, key: str) -> Answer | None:
        """The answer to give at once to a request carrying idempotency `key`: the first one
        again, or a 409 while that one is still being answered. None: the request is the key's
        first (or its earlier ones were not remembered), and end_key must follow it."""
        with self.lock:
            answer = self._answers.get(key)
            if answer is not None:
                self._replays += 1
                return answer
            if key in self._answering:
                self._conflicts += 1
                return STILL_ANSWERING
            self._answering.add(key)
            return None

    def end_key(self, key: str, answer: Answer | None) -> None:
        """Remember `answer` for `key` unless it asks to be tried again (a 429, a 5xx) or there
        is none (the request failed on the way): then the key's next request is a new one."""
        with self.lock:
            self._answering.discard(key)
            limit = self.config.max_idempotency_keys
            if answer is None or answer.status == THROTTLED or answer.status >= ERROR or not limit:
                return
            replayed = (*answer.headers, REPLAYED_HEADER)
            self._answers[key] = Answer(answer.status, answer.body, replayed)
            self._unique_keys += 1
            while len(self._answers) > limit:
                self._answers.popitem(last=False)

    def admit(
        self, path: str, status: int, request_id: str | None, key: str | None = None
    ) -> Admission:
        """Decide an arrival that would be answered `status` were it not for the limit and the
        injected errors, and log it."""
        with self.lock:
            now = time.monotonic_ns()
            config = self.config
            self._arrivals += 1
            arrival = Arrival(self._arrivals, now, path, status, request_id, key)
            injected_error = False
            if config.no_limit or self._enforced.take(now):
                # The advertised quota counts what the server served; when it advertises what
                # it enforces, the two buckets move together.
                self._advertised.charge(now)
                if config.error_rate and self._rng.random() < config.error_rate:
                    arrival.status = ERROR
                    injected_error = True
            else:
                arrival.status = THROTTLED
                arrival.throttled = True
                if config.retry_after:
                    self._set_retry_after(arrival, self._enforced.next_in_ns(now) / NS_PER_S)
            self._statuses[arrival.status] += 1
            self._throttled += arrival.throttled
            self._log.append(arrival)
            return Admission(
                arrival=arrival,
                config=config,
                remaining=self._advertised.remaining(now),
                reset_after=self._advertised.full_in_ns(now) / NS_PER_S,
                injected_error=injected_error,
            )

    def _set_retry_after(self, arrival: Arrival, wait: float) -> None:
        if self.config.retry_after_format == "date":
            # An HTTP-date has whole seconds: round the moment up, never ask for too little.
            date = math.ceil(self.epoch(arrival.t_ns) + wait)
            arrival.retry_date = date
            arrival.retry_after = date - self.epoch(arrival.t_ns)
            arrival.retry_until_ns = round((date - self.epoch_offset) * NS_PER_S)
        else:
            # Whole seconds rounded up, as most APIs send it: 0.05 s reads "1".
            arrival.retry_after = max(1, math.ceil(wait))

    def mark_sent(self, arrival: Arrival, sent_ns: int) -> None:
        """Record when a 429 went out: its Retry-After runs from there."""
        with self.lock:
            arrival.sent_ns = sent_ns
            if arrival.retry_date is None and arrival.retry_after is not None:
                arrival.retry_until_ns = sent_ns + round(arrival.retry_after * NS_PER_S)

    def reset(self) -> None:
        with self.lock:
            self._clear()

    def configure(self, config: SandboxConfig) -> None:
        """Take a new config from the next arrival on; requests spent stay spent."""
        with self.lock:
            now = time.monotonic_ns()
            old, self.config = self.config, config
            self._enforced.configure(config.enforced_rate, config.period, config.burst, now_ns=now)
            self._advertised.configure(config.rate, config.period, config.burst, now_ns=now)
            if config.seed != old.seed:
                self._rng = random.Random(config.seed)  # noqa: S311 (see _clear)
            if config.max_log != old.max_log:
                self._log = deque(self._log, maxlen=config.max_log)
            while len(self._answers) > config.max_idempotency_keys:
                self._answers.popitem(last=False)

    def stats(self, *, window: float | None = None, detail: bool = False) -> dict[str, Any]:
        """What /__stats answers; the keys are listed in ratejobs/sandbox/__init__.py."""
        with self.lock:
            config = self.config
            log = list(self._log)
            statuses = dict(self._statuses)
            arrivals = self._arrivals
            throttled = self._throttled
            keys = {
                "idempotent_replays": self._replays,
                "idempotent_conflicts": self._conflicts,
                "unique_keys": self._unique_keys,
            }
        window = config.period if window is None else window
        window_ns = max(1, int(window * NS_PER_S))
        times = [a.t_ns for a in log]
        admitted_times = [a.t_ns for a in log if not a.throttled]
        stats: dict[str, Any] = {
            "arrivals": arrivals,
            "ok": sum(n for status, n in statuses.items() if status < 400),
            "throttled": throttled,
            "errors": sum(n for status, n in statuses.items() if status >= 400) - throttled,
            "by_status": {str(status): n for status, n in sorted(statuses.items())},
            "window": window,
            "worst_window": worst_count_in_window(times, window_ns),
            "worst_window_admitted": worst_count_in_window(admitted_times, window_ns),
            "allowed": None
            if config.no_limit
            else config.burst + window * config.enforced_rate / config.period,
            "retry_after_violations": count_retry_after_violations(log),
            "log_size": len(log),
            "log_dropped": arrivals - len(log),
            **keys,
            "config": config.live_fields(),
        }
        if detail:
            stats["log"] = [self._describe(a) for a in log]
        return stats

    def _describe(self, arrival: Arrival) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "n": arrival.n,
            "t": self.epoch(arrival.t_ns),
            "status": arrival.status,
            "path": arrival.path,
            "request_id": arrival.request_id,
            "idempotency_key": arrival.key,
        }
        if arrival.throttled:
            entry["retry_after"] = arrival.retry_after
            entry["sent"] = None if arrival.sent_ns is None else self.epoch(arrival.sent_ns)
            until = arrival.retry_until_ns
            entry["retry_until"] = None if until is None else self.epoch(until)
        return entry


def worst_count_in_window(times_ns: Sequence[int], window_ns: int) -> int:
    """Most of the sorted `times_ns` inside any half-open window [t, t + window_ns)."""
    worst = start = 0
    for end, t in enumerate(times_ns):
        while t - times_ns[start] >= window_ns:
            start += 1
        worst = max(worst, end - start + 1)
    return worst


def count_retry_after_violations(log: Sequence[Arrival]) -> int:
    """Arrivals that came after some 429 was sent and before its Retry-After ran out.

    The quota is shared, so a 429 to one client tells every client to wait: a second worker that
    keeps sending while the first was told to back off is a violation too."""
    told = sorted(
        (a.sent_ns, a.retry_until_ns)
        for a in log
        if a.sent_ns is not None and a.retry_until_ns is not None
    )
    violations = i = 0
    until = -1
    for arrival in log:  # in arrival order
        while i < len(told) and told[i][0] < arrival.t_ns:
            until = max(until, told[i][1])
            i += 1
        if arrival.t_ns < until:
            violations += 1
    return violations
