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

from sandbox.bucket import MAIN, NS_PER_S, TOKENS, Decision, Limits, window_name
from sandbox.config import SandboxConfig

THROTTLED = 429
ERROR = 500
CONFLICT = 409
# Stripe's header on an answer given again for a repeated key.
REPLAYED_HEADER = ("Idempotent-Replayed", "true")
# --limit-by-header: header values whose buckets are kept; a test or benchmark uses thousands
# at most, and past it the least recently seen start full again.
MAX_HEADER_BUCKETS = 100_000


class Arrival:
    """One request to the API (control endpoints are not arrivals), as the log keeps it."""

    __slots__ = (
        "bucket",
        "cause",
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
        "tokens",
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
        self.tokens = 0  # tokens it was charged (none when throttled)
        self.cause: str | None = None  # the bucket that throttled it: main, window:<i>, tokens
        self.bucket: str | None = None  # whose buckets decided it (--limit-by-header), if any


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
    # Every bucket's quota after this request; `remaining` and `reset_after` are those of
    # decision.tightest.
    decision: Decision | None = None


class SandboxState:
    def __init__(self, config: SandboxConfig) -> None:
        self.lock = threading.Lock()
        self.config = config
        # Log times are monotonic; reports give them as epoch seconds on this one offset, so
        # they stay ordered and comparable even if the wall clock is stepped meanwhile.
        self.epoch_offset = time.time() - time.monotonic_ns() / NS_PER_S
        self._limits = Limits(config)
        self._clear()

    def _clear(self) -> None:
        self._limits.clear()
        # --limit-by-header: the buckets of each header value, least recently used first
        self._limits_by: OrderedDict[str, Limits] = OrderedDict()
        self._throttled_by: Counter[str] = Counter()
        self._tokens_admitted = 0
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
        self,
        path: str,
        status: int,
        request_id: str | None,
        key: str | None = None,
        *,
        tokens: int = 1,
        limit_key: str | None = None,
    ) -> Admission:
        """Decide an arrival of `tokens` tokens that would be answered `status` were it not for
        the limits and the injected errors, and log it."""
        with self.lock:
            now = time.monotonic_ns()
            config = self.config
            self._arrivals += 1
            arrival = Arrival(self._arrivals, now, path, status, request_id, key)
            injected_error = False
            # The advertised quota counts what the server served; when it advertises what it
            # enforces, it moves with the enforced one.
            decision = self._limits_for(limit_key).decide(now, tokens)
            arrival.bucket = limit_key
            if decision.admitted:
                arrival.tokens = tokens
                self._tokens_admitted += tokens
                if config.error_rate and self._rng.random() < config.error_rate:
                    arrival.status = ERROR
                    injected_error = True
            else:
                arrival.status = THROTTLED
                arrival.throttled = True
                arrival.cause = decision.cause
                self._throttled_by[decision.cause or MAIN] += 1
                # A request that can never fit (more tokens than the burst) gets no Retry-After.
                if config.retry_after and decision.wait is not None:
                    self._set_retry_after(arrival, decision.wait)
            self._statuses[arrival.status] += 1
            self._throttled += arrival.throttled
            self._log.append(arrival)
            tightest = decision.tightest
            return Admission(
                arrival=arrival,
                config=config,
                remaining=tightest.remaining,
                reset_after=tightest.reset_after,
                injected_error=injected_error,
                decision=decision,
            )

    def _limits_for(self, limit_key: str | None) -> Limits:
        """The buckets deciding a request: its header value's own (--limit-by-header, made
        full on first sight, the least recently used forgotten past MAX_HEADER_BUCKETS), else
        the one set."""
        if limit_key is None:
            return self._limits
        limits = self._limits_by.get(limit_key)
        if limits is None:
            limits = self._limits_by[limit_key] = Limits(self.config)
            while len(self._limits_by) > MAX_HEADER_BUCKETS:
                self._limits_by.popitem(last=False)
        else:
            self._limits_by.move_to_end(limit_key)
        return limits

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
            self._limits.configure(config, now_ns=now)
            for limits in self._limits_by.values():
                limits.configure(config, now_ns=now)
            if config.seed != old.seed:
                self._rng = random.Random(config.seed)  # noqa: S311 (see _clear)
            if config.max_log != old.max_log:
                self._log = deque(self._log, maxlen=config.max_log)
            while len(self._answers) > config.max_idempotency_keys:
                self._answers.popitem(last=False)

    def stats(self, *, window: float | None = None, detail: bool = False) -> dict[str, Any]:
        """What /__stats answers; the keys are listed in sandbox/__init__.py."""
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
            throttled_by = Counter({MAIN: 0, TOKENS: 0})
            throttled_by.update({window_name(i): 0 for i in range(len(config.windows))})
            throttled_by.update(self._throttled_by)
            tokens_admitted = self._tokens_admitted
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
            "throttled_by": dict(sorted(throttled_by.items(), key=_cause_order)),
            "windows": [
                {
                    "rate": rate,
                    "period": period,
                    "burst": burst,
                    "worst_window_admitted": worst_count_in_window(
                        admitted_times, max(1, int(period * NS_PER_S))
                    ),
                    "allowed": None if config.no_limit else burst + rate,
                }
                for rate, period, burst in config.windows
            ],
            "tokens": _token_stats(config, log, tokens_admitted, throttled_by[TOKENS]),
            "buckets": _bucket_stats(log, window_ns) if config.limit_by_header else {},
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
            "tokens": arrival.tokens,
            "bucket": arrival.bucket,
        }
        if arrival.throttled:
            entry["cause"] = arrival.cause
            entry["retry_after"] = arrival.retry_after
            entry["sent"] = None if arrival.sent_ns is None else self.epoch(arrival.sent_ns)
            until = arrival.retry_until_ns
            entry["retry_until"] = None if until is None else self.epoch(until)
        return entry


def _cause_order(item: tuple[str, int]) -> tuple[int, int, str]:
    # main, then the windows by number, then tokens (and any cause a config change left behind)
    cause = item[0]
    if cause == MAIN:
        return 0, 0, cause
    if cause.startswith("window:") and cause.removeprefix("window:").isdigit():
        return 1, int(cause.removeprefix("window:")), cause
    return 2, 0, cause


def _token_stats(
    config: SandboxConfig, log: Sequence[Arrival], admitted: int, throttled: int
) -> dict[str, Any]:
    """The token budget's figures: the most tokens admitted in any window of token_period
    against the most the budget allows there (token_burst + token_rate)."""
    on = config.token_rate is not None and config.token_period is not None
    window = config.token_period if on else config.period
    charged = [a for a in log if a.tokens]
    worst = worst_sum_in_window(
        [a.t_ns for a in charged], [a.tokens for a in charged], max(1, int(window * NS_PER_S))
    )
    return {
        "budget": on,
        "admitted": admitted,
        "throttled": throttled,
        "window": window,
        "worst_window": worst,
        "allowed": None
        if config.no_limit or not on
        else config.effective_token_burst + (config.token_rate or 0.0),
    }


def worst_sum_in_window(times_ns: Sequence[int], weights: Sequence[int], window_ns: int) -> int:
    """Largest sum of `weights` whose sorted `times_ns` fall inside one half-open window
    [t, t + window_ns)."""
    worst = total = start = 0
    for end, t in enumerate(times_ns):
        total += weights[end]
        while t - times_ns[start] >= window_ns:
            total -= weights[start]
            start += 1
        worst = max(worst, total)
    return worst


def _bucket_stats(log: Sequence[Arrival], window_ns: int) -> dict[str, dict[str, int]]:
    """--limit-by-header: per header value (by its digest), its arrivals, 429s and the most it
    had admitted in any window (each value's own limit applies to it)."""
    times: dict[str, list[int]] = {}
    admitted: dict[str, list[int]] = {}
    throttled: Counter[str] = Counter()
    for arrival in log:
        bucket = arrival.bucket or ""
        times.setdefault(bucket, []).append(arrival.t_ns)
        throttled[bucket] += arrival.throttled
        if not arrival.throttled:
            admitted.setdefault(bucket, []).append(arrival.t_ns)
    return {
        bucket: {
            "arrivals": len(times[bucket]),
            "throttled": throttled[bucket],
            "worst_window_admitted": worst_count_in_window(admitted.get(bucket, []), window_ns),
        }
        for bucket in sorted(times)
    }


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
    keeps sending while the first was told to back off is a violation too. With
    --limit-by-header each header value has its own quota, so each is counted on its own."""
    buckets: dict[str | None, list[Arrival]] = {}
    for arrival in log:
        buckets.setdefault(arrival.bucket, []).append(arrival)
    return sum(_violations(arrivals) for arrivals in buckets.values())


def _violations(log: Sequence[Arrival]) -> int:
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
