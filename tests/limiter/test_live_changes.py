"""Live changes: new limits take effect at the next grant, without restarting callers."""

from __future__ import annotations

import threading
import time

from ratejobs.limiter import Limiter, LimiterConfig


def test_raised_rate_reaches_a_caller_waiting_on_an_old_slot(make_limiter, redis_client):
    # given 1 request per 4 s: the second caller holds a slot 4 s away
    limiter = make_limiter(LimiterConfig(rate=1, period=4))
    first = limiter.acquire()
    got: dict = {}
    waiter = threading.Thread(target=lambda: got.update(grant=limiter.acquire()))
    waiter.start()
    time.sleep(0.2)
    # when an operator raises the rate to 100/s
    changed = Limiter(redis_client, limiter.name).configure(LimiterConfig(rate=100))
    waiter.join(10)
    # expect: the waiter is granted within about a second, not at its old slot
    assert changed
    assert got["grant"].slot_us - first.slot_us < 2_000_000


def test_lowered_rate_applies_to_the_next_grant(make_limiter, redis_client):
    limiter = make_limiter(LimiterConfig(rate=100))
    a = limiter.acquire()
    limiter.configure(LimiterConfig(rate=10))
    b = limiter.acquire()
    c = limiter.acquire()
    assert c.slot_us - b.slot_us == 100_000
    assert b.slot_us - a.slot_us >= 10_000


def test_raised_cap_applies_without_restart(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=1000, burst=10, max_concurrency=1))
    limiter.acquire()
    limiter.configure(LimiterConfig(rate=1000, burst=10, max_concurrency=2))
    limiter.acquire(max_wait=0.5)
    assert limiter.state().in_flight == 2


def test_same_configuration_changes_nothing(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=5, burst=2))
    generation = limiter.state().generation
    assert limiter.configure(LimiterConfig(rate=5, burst=2)) is False
    assert limiter.state().generation == generation


def test_a_limiter_with_config_configures_redis_after_a_flush(make_limiter, redis_client):
    # given Redis lost the config (restart without persistence): the worker that knows it
    # puts it back and carries on
    limiter = make_limiter(LimiterConfig(rate=50, burst=2))
    redis_client.delete(limiter.config_key)
    limiter.acquire()
    assert limiter.state().rate == 50


def test_an_older_version_never_overwrites_a_newer_one(make_limiter, redis_client):
    # given limits at version 2 (an operator's change) and a worker that read version 1 before it
    limiter = make_limiter(LimiterConfig(rate=2, version=2))
    stale_worker = Limiter(redis_client, limiter.name, LimiterConfig(rate=10, version=1))
    # when the stale worker configures
    assert stale_worker.configure(LimiterConfig(rate=10, version=1)) is False
    # expect: Redis keeps version 2, and the stale worker's grants run at 2/s too
    first, second = stale_worker.acquire(), stale_worker.acquire()
    assert second.slot_us - first.slot_us == 500_000
    assert limiter.state().config_version == 2


def test_a_rolled_back_config_is_rewritten_at_the_next_grant(make_limiter, redis_client):
    # given version 1 at 10/s, saved as a snapshot of the config key would keep it
    limiter = make_limiter(LimiterConfig(rate=10, version=1))
    old_config = redis_client.dump(limiter.config_key)
    limiter.configure(LimiterConfig(rate=2, version=2))
    # when Redis rolls the key back to the snapshot (a restore from an older dump)
    redis_client.restore(limiter.config_key, 0, old_config, replace=True)
    assert limiter.state().config_version == 1
    # expect: the next grant puts version 2 back first and runs at 2/s
    first, second = limiter.acquire(), limiter.acquire()
    assert second.slot_us - first.slot_us == 500_000
    assert (limiter.state().config_version, limiter.state().rate) == (2, 2.0)
    many = limiter.acquire_many(2)
    assert [b.slot_us - a.slot_us for a, b in zip(many, many.grants[1:], strict=False)] == [500_000]


def test_a_new_version_of_the_same_limits_keeps_the_generation(make_limiter):
    limiter = make_limiter(LimiterConfig(rate=5, version=1))
    generation = limiter.state().generation
    assert limiter.configure(LimiterConfig(rate=5, version=2)) is False
    assert (limiter.state().generation, limiter.state().config_version) == (generation, 2)
