"""In-flight cap: at most max_concurrency leases across workers; a dead worker's lease expires."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from ratejobs.limiter import Limiter, LimiterConfig, WaitTooLong
from tests.limiter.workers import hold_lease_and_die


def test_in_flight_never_exceeds_the_cap(make_limiter, redis_client):
    # given 8 threads, each its own limiter, holding every lease for 20 ms under a cap of 3
    shared = make_limiter(LimiterConfig(rate=10_000, burst=10, max_concurrency=3))
    limiters = [Limiter(redis_client, shared.name) for _ in range(8)]
    lock, in_flight, worst = threading.Lock(), [0], [0]

    def caller(limiter: Limiter) -> None:
        for _ in range(8):
            with limiter.slot():
                with lock:
                    in_flight[0] += 1
                    worst[0] = max(worst[0], in_flight[0])
                    assert limiter.state().in_flight <= 3
                time.sleep(0.02)
                with lock:
                    in_flight[0] -= 1

    threads = [threading.Thread(target=caller, args=(lim,)) for lim in limiters]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert worst[0] == 3
    assert shared.state().in_flight == 0


@pytest.mark.slow
def test_lease_of_a_killed_worker_expires(make_limiter, redis_url, spawn):
    # given a cap of 1 and a worker killed with -9 while holding the only lease (2 s lease)
    limiter = make_limiter(LimiterConfig(rate=100, max_concurrency=1))
    ready = spawn.Event()
    worker = spawn.Process(
        target=hold_lease_and_die,
        args=(redis_url, limiter.name, 2.0, ready),
        kwargs={"config": limiter.config},
    )
    worker.start()
    assert ready.wait(30)
    os.kill(worker.pid, signal.SIGKILL)
    worker.join(10)
    assert limiter.state().in_flight == 1
    # expect: nobody gets through while the lease lives, everybody after it expires
    try:
        limiter.acquire(max_wait=0.3)
        raise AssertionError("granted while the dead worker's lease was still live")
    except WaitTooLong:
        pass
    grant = limiter.acquire(max_wait=10)
    assert limiter.state().in_flight == 1
    limiter.release(grant)
    assert limiter.state().in_flight == 0


def test_release_wakes_a_caller_waiting_for_capacity(make_limiter, redis_client):
    limiter = make_limiter(LimiterConfig(rate=1000, burst=5, max_concurrency=1))
    held = limiter.acquire()
    other = Limiter(redis_client, limiter.name)
    got: dict = {}
    waiter = threading.Thread(target=lambda: got.update(grant=other.acquire(max_wait=10)))
    waiter.start()
    time.sleep(0.2)
    assert "grant" not in got
    limiter.release(held)
    waiter.join(10)
    assert got["grant"].granted_us > held.granted_us
