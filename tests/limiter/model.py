"""A small pure-Python reference model of the limiter scripts, for the stateful test.

It is written from the rules in the Lua headers, not from the Lua code: given the same Redis
time it must reach the same decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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


@dataclass
class ReferenceLimiter:
    """Schedule times are (whole µs, fraction) pairs, as the scripts store them."""

    config: ModelConfig | None = None
    tat: tuple[int, float] = (0, 0.0)
    granted_tat: tuple[int, float] = (0, 0.0)
    blocked_until: float = 0.0
    generation: int = 0
    wmax: float | None = None
    wstart: float | None = None
    decreased_at: float | None = None
    leases: dict[str, float] = field(default_factory=dict)

    def current_rate(self, now: float) -> float:
        cfg = self.config
        if not cfg.adaptive or self.wmax is None:
            return cfg.rate
        k = cfg.recovery_seconds
        scale = (self.wmax - self.wstart) / (k * k * k)
        d = (now - self.decreased_at) / 1_000_000 - k
        return max(cfg.min_rate, min(cfg.rate, self.wmax + scale * d * d * d))

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
        self, now: int, weight: int, lease: str, ttl: int, max_wait: int, held: int, held_gen: int
    ) -> tuple[int, int, int, int]:
        """Returns (code, wait, slot, generation) as acquire.lua does."""
        cfg = self.config
        if cfg is None:
            return NOT_CONFIGURED, 0, 0, 0
        interval = cfg.period * 1_000_000 / self.current_rate(now)

        def grant(slot: int) -> tuple[int, int, int, int]:
            self.leases[lease] = now + ttl
            granted = max(self.offset(self.granted_tat, now), slot - now) + weight * interval
            self.granted_tat = self.at_offset(now, granted)
            return GRANTED, 0, slot, self.generation

        on_time = now - held < weight * interval
        if held >= self.blocked_until and held_gen == self.generation and on_time:
            if now >= held:
                return grant(held)
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
                now, weight, f"{prefix}:{i}", ttl, max_wait, -1, -1
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
            self._new_generation()
        return accepted, self.generation, self.blocked_until, before, self.current_rate(now)
