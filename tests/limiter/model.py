"""A small pure-Python reference model of the limiter scripts, for the stateful test.

It is written from the rules in the Lua headers, not from the Lua code: given the same Redis
time it must reach the same decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# lib/adaptive.lua's learning constants (the values, not a reading of the Lua).
LEARN_HOLD = 0.99
LEARN_CLIMB = 2.0
LEARN_ROUGH_CLIMB = 0.5
LEARN_PROBE = 0.002
LEARN_PRECISE_GRANTS = 50
LEARN_MIN_SPAN_US = 100_000
LEARN_BUSY = 0.9
# How early a holder may confirm its reservation (rule R1): granted, it sleeps the rest.
CONFIRM_AHEAD_US = 5_000

GRANTED, WAIT, TOO_LONG, AT_CAPACITY, NOT_CONFIGURED = 0, 1, 2, 3, 4


@dataclass
class ModelConfig:
    rate: float
    period: float
    burst: int
    max_concurrency: int
    adaptive: bool
    min_rate: float
    decrease_factor: float
    recovery_seconds: float
    learn: bool = True


@dataclass
class ReferenceLimiter:
    """Schedule times are (whole µs, fraction) pairs, as the scripts store them."""

    config: ModelConfig | None = None
    tat: tuple[int, float] = (0, 0.0)
    granted_tat: tuple[int, float] = (0, 0.0)
    blocked_until: float = 0.0
    # A state's first generation is Redis TIME (µs) when it is created, so that no number from
    # before a reset comes again after it; None until then.
    generation: int | None = None
    wmax: float | None = None
    wstart: float | None = None
    decreased_at: float | None = None
    leases: dict[str, float] = field(default_factory=dict)
    grants: int = 0
    # learning the real limit: the estimate, whether it is sure, the phase since the last
    # accepted throttle (target rate, from when, grants then) and the shortest interval
    learned: float | None = None
    learn_sure: bool = False
    learn_target: float | None = None
    learn_from: int | None = None
    learn_grants: int = 0
    learn_base: tuple[int, int] | None = None
    learn_base_gen: int | None = None  # generation of the base interval's grants
    learn_base_late: int = 0  # its grants reported 429 after its throttle

    def _learning_now(self, now: float) -> float:
        """`now` while sending; once nothing was granted for a whole period, the moment that
        became so: the learning rate stands still while the API is idle."""
        idle_at = self.offset(self.granted_tat, now) + self.config.period * 1_000_000
        return now + min(0, idle_at)

    def _since(self, now: float) -> float:
        """Seconds of the learning phase at `now` (0 before it), idle time not counted."""
        return max(0, self._learning_now(now) - self.learn_from) / 1_000_000

    def _start_learning_phase(self, now: int) -> None:
        """A learning phase starts at the first acquire a state sees and at the first after an
        idle spell, from the rate it stands at: the API's bucket is full then, as after a
        block."""
        cfg = self.config
        if not (cfg.adaptive and cfg.learn):
            return
        if self.learn_from is not None and (
            self.learn_target is None or now <= self.learn_from or self._learning_now(now) >= now
        ):
            return
        self.learn_target = self.current_rate(now)
        self.learn_from = now
        self.learn_grants = self.grants

    def _climb(self) -> float:
        """Per recovery period before the limit is sure: gentler from a rough estimate."""
        return LEARN_ROUGH_CLIMB if self.learned is not None else LEARN_CLIMB

    def _learning_rate(self, now: float) -> float:
        """The learning phase's rate; idle, never above where a learned limit is held (0.99 of
        it once sure), so the next job starts from what was learned."""
        t = self._since(now) / self.config.recovery_seconds
        if self.learn_sure:
            r = self.learn_target * (1 + LEARN_PROBE * t * t * t)
        else:
            r = self.learn_target * (1 + self._climb() * t)
        if self._learning_now(now) < now and self.learned is not None:
            r = min(r, self.learned * LEARN_HOLD if self.learn_sure else self.learned)
        return r

    def current_rate(self, now: float) -> float:
        cfg = self.config
        if not cfg.adaptive:
            return cfg.rate
        if cfg.learn and self.learn_target is not None:
            r = self._learning_rate(now)
        elif self.wmax is not None:
            k = cfg.recovery_seconds
            scale = (self.wmax - self.wstart) / (k * k * k)
            d = (now - self.decreased_at) / 1_000_000 - k
            r = self.wmax + scale * d * d * d
        else:
            return cfg.rate
        return max(cfg.min_rate, min(cfg.rate, r))

    def _learn(self, now: int, before: float) -> None:
        """An accepted throttle measures the real limit: the grants the server accepted since
        sending resumed, against the shortest such interval (the server's burst)."""
        cfg = self.config
        span = now - (self.learn_from if self.learn_from is not None else now)
        if self.learn_target is not None and span > 0:
            accepted = self.grants - self.learn_grants - 1
            t, k = span / 1_000_000, cfg.recovery_seconds
            if self.learn_sure:
                units = t + LEARN_PROBE * t * t * t * t / (4 * k * k * k)
            else:
                units = t + self._climb() * t * t / (2 * k)
            allowed = min(self.learn_target * units, cfg.rate * t) / cfg.period
            if accepted >= LEARN_BUSY * allowed:
                period_us = cfg.period * 1_000_000
                base = self.learn_base
                if base and span - base[0] >= LEARN_MIN_SPAN_US and accepted > base[1]:
                    slope = (accepted - base[1]) * period_us / (span - base[0])
                    resumed_at = max(cfg.min_rate, min(cfg.rate, self.learn_target))
                    if slope <= resumed_at:
                        # pushed above the limit all along: the server's own pace
                        # one measurement cuts no deeper than CUBIC would
                        floor = before * cfg.decrease_factor
                        self.learned = max(slope, floor)
                        # a throttle while holding a sure estimate corrects it; it stays sure
                        self.learn_sure = slope >= floor and (
                            self.learn_sure or accepted - base[1] >= LEARN_PRECISE_GRANTS
                        )
                    else:
                        # climbed past it: the climb's excess used up the server's burst
                        burst = max(1, base[1] - self.learn_base_late - slope * base[0] / period_us)
                        s = self.since_slope(now)
                        estimate = max(resumed_at, before - math.sqrt(2 * burst * s))
                        # a learned limit below the rate throttled at still fits: kept unless
                        # the estimate is higher
                        if (
                            self.learned is None
                            or estimate > self.learned
                            or self.learned >= before
                        ):
                            self.learned = estimate
                        self.learn_sure = True
                    self.learned = min(self.learned, cfg.rate)
                if base is None or span < base[0]:
                    self.learn_base = (span, accepted)
                    self.learn_base_gen, self.learn_base_late = self.generation, 0
        target = before * cfg.decrease_factor
        if self.learned is not None and self.learn_sure:
            target = self.learned * LEARN_HOLD
        elif self.learned is not None:
            target = self.learned
        self.learn_target = min(target, before)
        self.learn_from = max(now, self.blocked_until)
        self.learn_grants = self.grants

    def since_slope(self, now: int) -> float:
        """How fast the learning rate climbs at `now`, requests per period per period."""
        cfg = self.config
        t = self._since(now) / cfg.recovery_seconds
        per_period = cfg.period / cfg.recovery_seconds
        if self.learn_sure:
            return self.learn_target * 3 * LEARN_PROBE * t * t * per_period
        return self.learn_target * self._climb() * per_period

    def _new_generation(self) -> None:
        self.generation += 1
        self.tat = self.granted_tat

    @staticmethod
    def offset(time: tuple[int, float], now: int) -> float:
        return (time[0] - now) + time[1]

    @staticmethod
    def at_offset(now: int, offset: float) -> tuple[int, float]:
        whole = math.floor(offset)
        return now + whole, offset - whole

    def interval(self, now: float) -> float:
        return self.config.period * 1_000_000 / self.current_rate(now)

    def configure(self, config: ModelConfig, now: int) -> bool:
        if self.generation is None:
            self.generation = now
        changed = config != self.config
        if changed:
            old_interval = self.interval(now) if self.config else None
            self.config = config
            owed = self.offset(self.granted_tat, now)
            if old_interval is not None and owed > 0:
                # the pace owed for past grants is converted to the new rate
                self.granted_tat = self.at_offset(now, owed * self.interval(now) / old_interval)
            self._new_generation()
        return changed

    def acquire(
        self,
        now: int,
        weight: int,
        lease: str,
        ttl: int,
        max_wait: int,
        held: int,
        held_gen: int,
        *,
        ahead: bool = True,
    ) -> tuple[int, int, int, int]:
        """Returns (code, wait, slot, generation) as acquire.lua does (acquire_many.lua's
        slots without `ahead`: it grants none before its slot)."""
        cfg = self.config
        if cfg is None:
            return NOT_CONFIGURED, 0, 0, 0
        self._start_learning_phase(now)
        interval = cfg.period * 1_000_000 / self.current_rate(now)

        def grant(slot: int) -> tuple[int, int, int, int]:
            if cfg.max_concurrency:  # leases exist only to hold a cap
                self.leases[lease] = now + ttl
            self.grants += 1
            granted = max(self.offset(self.granted_tat, now), slot - now) + weight * interval
            self.granted_tat = self.at_offset(now, granted)
            return GRANTED, 0, slot, self.generation

        on_time = now - held < weight * interval
        if held >= self.blocked_until and held_gen == self.generation and on_time:
            if now >= held - CONFIRM_AHEAD_US:
                return GRANTED, max(0, held - now), *grant(held)[2:]
            return WAIT, held - now, held, self.generation
        tat = self.offset(self.tat, now)
        wait = math.ceil(max(0, self.blocked_until - now, tat - (cfg.burst - weight) * interval))
        slot = now + wait
        if max_wait >= 0 and wait > max_wait:
            self.leases.pop(lease, None)
            return TOO_LONG, wait, slot, self.generation
        if lease not in self.leases:
            self.leases = {k: v for k, v in self.leases.items() if v > now}
            if cfg.max_concurrency and len(self.leases) >= cfg.max_concurrency:
                return AT_CAPACITY, min(self.leases.values()) - now, 0, self.generation
        self.tat = self.at_offset(now, max(tat, wait) + weight * interval)
        if wait == 0:
            return grant(slot)
        if ahead and wait <= CONFIRM_AHEAD_US:  # near enough to be confirmed at once
            return GRANTED, wait, *grant(slot)[2:]
        if cfg.max_concurrency:
            self.leases[lease] = slot + ttl
        return WAIT, wait, slot, self.generation

    def acquire_many(
        self, now: int, weight: int, count: int, prefix: str, ttl: int, max_wait: int
    ) -> tuple[int, int, int, list[int]]:
        """Returns (code, hint, generation, slots) as acquire_many.lua does: the answers of
        `count` fresh acquires at the same instant, stopping at the first that is not a grant
        or a reservation."""
        if self.config is None:
            return NOT_CONFIGURED, 0, 0, []
        slots: list[int] = []
        for i in range(1, count + 1):
            code, wait, slot, generation = self.acquire(
                now, weight, f"{prefix}:{i}", ttl, max_wait, -1, -1, ahead=False
            )
            if code not in (GRANTED, WAIT):
                return code, wait, generation, slots
            slots.append(slot)
        return GRANTED, 0, self.generation, slots

    def release(self, lease: str) -> bool:
        return self.leases.pop(lease, None) is not None

    def release_many(self, leases: list[str]) -> int:
        return sum(self.release(lease) for lease in leases)

    def feedback(
        self, now: int, generation: int, block: int, throttled: bool
    ) -> tuple[bool, int, int, float, float]:
        """Returns (accepted, generation, blocked_until, rate_before, rate_after)."""
        before = self.current_rate(now)
        accepted = False
        if block > 0 and now + block > self.blocked_until:
            self.blocked_until = now + block
        if throttled and (generation < 0 or generation == self.generation):
            accepted = True
            if self.config.adaptive:
                # CUBIC fast convergence: a throttle below the last peak lowers the target
                below_peak = self.wmax is not None and before < self.wmax
                self.wmax = before * (1 + self.config.decrease_factor) / 2 if below_peak else before
                self.wstart = before * self.config.decrease_factor
                self.decreased_at = now
                if self.config.learn:
                    self._learn(now, before)
            self._new_generation()
        elif (
            throttled
            and self.config.adaptive
            and self.config.learn
            and (generation == self.learn_base_gen)
        ):
            # a 429 about the base interval's grants, sent while its throttle was in flight
            self.learn_base_late += 1
        return accepted, self.generation, self.blocked_until, before, self.current_rate(now)
