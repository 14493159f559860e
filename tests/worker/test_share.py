"""A worker process holds at most its share of an API's calls (unless adaptive or sent with a
credential key): the API's rate divided among the live worker processes, over a quarter second
plus the API's response time. More only sleep on slots further ahead (bench-fleet: 2 workers of
-c 4 at 300/s)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from ratejobs.infra.heartbeats import worker_heartbeat
from ratejobs.models import Api, Job
from ratejobs.services.calls import Claimed
from ratejobs.worker import engine

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_process_holds_at_most_its_share_and_waits_for_its_calls_to_end(
    user, unique_name, redis_down
):
    # given an API at 300/s and four live worker processes (this one among them); Redis is
    # unreachable, so the engine's sweep takes no deployment-wide lock that would outlive it
    api = Api.objects.create(name=unique_name, base_url="https://api.example.com", rate=300)
    job = Job.objects.create(owner=user, api=api, name="j", status=Job.Status.RUNNING, total=1)
    process = engine.Engine(in_flight=64, heartbeat_seconds=0.2, sweep_seconds=1)
    try:
        process._alive.wait(10)
        for i in range(3):
            worker_heartbeat(owner=f"other-host:{1000 + i}:{unique_name}")
        # expect: before any response, its share is 300/4 over a quarter second plus a second
        # (a slow API's first calls are not held to a fast one's share): 94 calls
        assert process._share(job.pk) == (api.pk, 94)
        # and once its responses come in about at once, 300/4 over a quarter second: 19
        process._latency_by_api[api.pk] = 0.0
        share = process._share(job.pk)
        assert share == (api.pk, 19)
        # and of 64 places it keeps 19, giving the rest back to the pool
        assert process._within_share(share, process.pool.reserve(64)) == 19
        assert process.pool.busy == 19
        # and a claim with the share full waits until its calls end
        got: list[int] = []
        waiter = threading.Thread(
            target=lambda: got.append(process._within_share(share, process.pool.reserve(8)))
        )
        waiter.start()
        time.sleep(0.2)
        assert got == []
        process._release_share(api.pk, 5)
        waiter.join(5)
        assert got == [5]
        # and an API with an in-flight cap has one too, but a job sent with a credential key
        # has none (each key's bucket adds the API's rate)
        api.max_concurrency = 4
        api.save()
        assert process._share(job.pk) == (api.pk, 19)
        # and an adaptive API has none (its rate moves under the share)
        Api.objects.filter(pk=api.pk).update(adaptive=True)
        assert process._share(job.pk) is None
        Api.objects.filter(pk=api.pk).update(adaptive=False)
        Job.objects.filter(pk=job.pk).update(credential_key="second")
        assert process._share(job.pk) is None
    finally:
        process.pool.unreserve(process.pool.busy)
        process.stop(timeout=5)


def test_only_a_call_counted_in_the_share_gives_a_place_of_it_back(
    user, unique_name, redis_down, monkeypatch
):
    # given an API whose share holds 3 calls of this process, and a call of the same API sent
    # with a credential key (no share: each key's bucket adds the API's rate)
    api = Api.objects.create(name=unique_name, base_url="https://api.example.com", rate=300)
    process = engine.Engine(in_flight=8, heartbeat_seconds=0.2, sweep_seconds=1)
    try:
        process._alive.wait(10)
        process._held_by_api[api.pk] = 3
        monkeypatch.setattr(process, "_attempt_and_hand_over", lambda item: None)
        call = SimpleNamespace(job=SimpleNamespace(api_id=api.pk, api=api))
        # when it ends, then one counted in the share ends
        process._attempt(Claimed(call, "t1", SimpleNamespace()))
        assert process._held_by_api[api.pk] == 3
        process._attempt(Claimed(call, "t2", SimpleNamespace(), in_share=True))
        # expect: only the second gave its place back
        assert process._held_by_api[api.pk] == 2
    finally:
        process.stop(timeout=5)
