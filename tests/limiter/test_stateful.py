"""The Lua scripts, driven by Hypothesis, agree with the reference model step by step."""

from __future__ import annotations

import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
)

from ratejobs.limiter import Limiter, LimiterConfig
from tests.limiter.model import ModelConfig, ReferenceLimiter

LEASE_TTL_US = 3_600_000_000  # long enough that no lease expires during a run

configs = st.builds(
    LimiterConfig,
    rate=st.sampled_from([1.0, 7.0, 50.0, 1000.0, 3.3]),
    period=st.sampled_from([1.0, 0.5, 60.0]),
    burst=st.integers(1, 4),
    max_concurrency=st.integers(0, 3),
    adaptive=st.booleans(),
    min_rate=st.none(),
    recovery_seconds=st.sampled_from([0.05, 10.0]),
    learn=st.booleans(),
)


def model_config(config: LimiterConfig) -> ModelConfig:
    return ModelConfig(
        rate=config.rate,
        period=config.period,
        burst=config.burst,
        max_concurrency=config.max_concurrency,
        adaptive=config.adaptive,
        min_rate=config.floor_rate,
        decrease_factor=config.decrease_factor,
        recovery_seconds=config.recovery_seconds,
        learn=config.learn,
    )


@pytest.fixture
def machine_limiter(redis_client, unique_name):
    limiter = Limiter(redis_client, unique_name)
    yield limiter
    redis_client.delete(*limiter.keys)


@pytest.mark.slow
def test_scripts_agree_with_reference_model(machine_limiter):
    class LimiterMachine(RuleBasedStateMachine):
        reservations = Bundle("reservations")

        def __init__(self) -> None:
            super().__init__()
            self.limiter = machine_limiter
            self.limiter.client.delete(*self.limiter.keys)
            self.model = ReferenceLimiter()
            self.counter = 0
            self.generations_seen: list[int] = []

        def _acquire(self, weight: int, lease: str, max_wait: int, held: int, held_gen: int):
            reply = self.limiter._scripts["acquire"](
                keys=self.limiter.keys,
                args=[weight, lease, LEASE_TTL_US, max_wait, held, held_gen],
            )
            code, wait, slot, generation, now = (int(x) for x in reply[:5])
            expected = self.model.acquire(
                now, weight, lease, LEASE_TTL_US, max_wait, held, held_gen
            )
            assert (code, wait, slot, generation) == expected
            self.generations_seen.append(generation)
            return code, slot, generation

        @initialize(config=configs)
        def configure(self, config: LimiterConfig) -> None:
            self._configure(config)

        @rule(config=configs)
        def reconfigure(self, config: LimiterConfig) -> None:
            self._configure(config)

        def _configure(self, config: LimiterConfig) -> None:
            limiter = self.limiter
            changed, generation, now, _ = limiter._scripts["configure"](
                keys=[limiter.config_key, limiter.state_key, limiter.heads_key],
                args=config.as_script_args(),
            )
            assert bool(changed) == self.model.configure(model_config(config), int(now))
            assert generation == self.model.generation

        @rule(
            target=reservations,
            weight=st.integers(1, 4),
            max_wait=st.sampled_from([-1, 0, 50_000, 5_000_000]),
        )
        def acquire(self, weight: int, max_wait: int):
            if weight > self.model.config.burst:
                weight = self.model.config.burst
            self.counter += 1
            lease = f"lease-{self.counter}"
            code, slot, generation = self._acquire(weight, lease, max_wait, -1, -1)
            return (lease, weight, slot, generation) if code in (0, 1) else (lease, weight, -1, -1)

        @rule(reservation=reservations)
        def confirm(self, reservation) -> None:
            lease, weight, slot, generation = reservation
            if weight <= self.model.config.burst:
                self._acquire(weight, lease, -1, slot, generation)

        @rule(
            target=reservations,
            weight=st.integers(1, 4),
            count=st.integers(1, 5),
            max_wait=st.sampled_from([-1, 0, 50_000, 5_000_000]),
        )
        def acquire_many(self, weight: int, count: int, max_wait: int):
            weight = min(weight, self.model.config.burst)
            self.counter += 1
            prefix = f"batch-{self.counter}"
            reply = self.limiter._scripts["acquire_many"](
                keys=self.limiter.keys, args=[weight, count, prefix, LEASE_TTL_US, max_wait]
            )
            code, hint, generation, now = (int(x) for x in reply[:4])
            slots = [int(x) for x in reply[6:]]
            expected = self.model.acquire_many(now, weight, count, prefix, LEASE_TTL_US, max_wait)
            assert (code, hint, generation, slots) == expected
            self.generations_seen.append(generation)
            # One entry per slot asked for, as acquire gives one per call: how many were
            # reserved depends on the time between steps, and a bundle whose size did would
            # make Hypothesis's generation flaky (FlakyStrategyDefinition). A slot not reserved
            # is a refused one, (lease, weight, -1, -1), as acquire's.
            refused = [(f"{prefix}:{i}", weight, -1, -1) for i in range(len(slots) + 1, count + 1)]
            return multiple(
                *((f"{prefix}:{i}", weight, slot, generation) for i, slot in enumerate(slots, 1)),
                *refused,
            )

        @rule(leases=st.lists(reservations, max_size=4))
        def release_many(self, leases) -> None:
            ids = [reservation[0] for reservation in leases]
            if not ids:
                return
            released, _ = self.limiter._scripts["release"](
                keys=[self.limiter.config_key, self.limiter.leases_key, self.limiter.released_key],
                args=["", *ids],
            )
            assert released == self.model.release_many(list(dict.fromkeys(ids)))

        @rule(
            signals=st.lists(
                st.tuples(reservations, st.sampled_from([0, 1_000, 2_000_000]), st.booleans()),
                min_size=1,
                max_size=4,
            )
        )
        def feedback_many(self, signals) -> None:
            args = []
            for reservation, block, throttled in signals:
                args += [reservation[3], block, int(throttled)]
            # ARGV[1], ARGV[2]: no rate history (not part of the model's decisions)
            reply = self.limiter._scripts["feedback_many"](
                keys=[self.limiter.config_key, self.limiter.state_key], args=[0, 0, *args]
            )
            assert int(reply[0]) == 0
            now = int(reply[1])
            for (reservation, block, throttled), item in zip(signals, reply[2:], strict=True):
                accepted, gen, blocked_until, before, after = self.model.feedback(
                    now, reservation[3], block, throttled
                )
                assert (bool(int(item[0])), int(item[1]), int(item[2])) == (
                    accepted,
                    gen,
                    blocked_until,
                )
                assert float(item[3]) == pytest.approx(before, rel=1e-12)
                assert float(item[4]) == pytest.approx(after, rel=1e-12)

        @rule(reservation=reservations)
        def release(self, reservation) -> None:
            lease = reservation[0]
            released, _ = self.limiter._scripts["release"](
                keys=[self.limiter.config_key, self.limiter.leases_key, self.limiter.released_key],
                args=["", lease],
            )
            assert bool(released) == self.model.release(lease)

        @rule(
            reservation=reservations,
            block=st.sampled_from([0, 1_000, 2_000_000]),
            throttled=st.booleans(),
        )
        def feedback(self, reservation, block: int, throttled: bool) -> None:
            generation = reservation[3]
            reply = self.limiter._scripts["feedback"](
                keys=[self.limiter.config_key, self.limiter.state_key],
                args=[generation, block, int(throttled)],
            )
            assert int(reply[0]) == 0
            now = int(reply[4])
            accepted, gen, blocked_until, before, after = self.model.feedback(
                now, generation, block, throttled
            )
            assert (bool(int(reply[1])), int(reply[2]), int(reply[3])) == (
                accepted,
                gen,
                blocked_until,
            )
            assert float(reply[5]) == pytest.approx(before, rel=1e-12)
            assert float(reply[6]) == pytest.approx(after, rel=1e-12)

        @invariant()
        def generation_never_goes_back(self) -> None:
            assert self.generations_seen == sorted(self.generations_seen)

        @invariant()
        def in_flight_matches(self) -> None:
            state = self.limiter.state()
            if self.model.config is not None:
                now = state.now_us
                assert state.in_flight == sum(1 for v in self.model.leases.values() if v > now)
                assert state.generation == self.model.generation

    LimiterMachine.TestCase.settings = settings(
        max_examples=60,
        stateful_step_count=30,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    LimiterMachine.TestCase("runTest").runTest()
