"""Dispatch: a bounded window of broker messages per API, shared fairly between jobs."""

from __future__ import annotations

import base64
import json
import threading
import time
from datetime import timedelta

import pytest
import redis
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ratejobs.infra.clock import database_now
from ratejobs.infra.limiters import api_limiter
from ratejobs.models import ApiCredential, Call, Job, JobSecond
from ratejobs.namespace import broker_key
from ratejobs.services.apis import api_create
from ratejobs.services.credentials import credentials_add
from ratejobs.services.jobs import job_cancel, job_create, job_pause, job_resume
from ratejobs.worker.dispatch import capped_window, dispatch_api, dispatch_window
from ratejobs.worker.reconcile import reconcile

pytestmark = pytest.mark.django_db(transaction=True)

BROKER_QUEUE = "celery"


@pytest.fixture
def owner():
    return get_user_model().objects.create_user("dispatch-owner", password="x")


# How long a test waits for another transaction to reach a lock it is meant to wait on: only
# a hung or broken setup takes this long.
LOCK_WAIT_TIMEOUT_SECONDS = 10.0


def backend_pid() -> int:
    """This thread's PostgreSQL backend (its connection opened if need be)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def wait_until_blocked(waiter: int, holder: int) -> None:
    """Return once PostgreSQL shows backend `waiter` waiting on a lock that backend `holder`
    holds: the race a test sets up has then begun, however long the waiter took to get there."""
    deadline = time.monotonic() + LOCK_WAIT_TIMEOUT_SECONDS
    with connection.cursor() as cursor:
        while True:
            cursor.execute("SELECT %s = ANY(pg_blocking_pids(%s))", [holder, waiter])
            if cursor.fetchone()[0]:
                return
            assert time.monotonic() < deadline, f"backend {waiter} never waited on {holder}"
            time.sleep(0.01)


def calls(n: int) -> list[dict]:
    return [{"method": "GET", "path": f"/items/{i}"} for i in range(n)]


def calls_in_broker(broker: redis.Redis) -> int:
    """Call ids in the queue's messages (a message carries several calls of one job)."""
    count = 0
    for raw in broker.lrange(broker_key(BROKER_QUEUE), 0, -1):
        message = json.loads(raw)
        if message["headers"]["task"] == "ratejobs.execute_calls":
            body = json.loads(base64.b64decode(message["body"]))
            count += len(body[0][1])
    return count


@pytest.mark.slow
def test_a_large_job_never_puts_more_than_the_window_in_the_broker(broker, owner, unique_name):
    # given a job of 20,000 calls on an API at 50/s (a window of 100 messages) and no workers
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=50)
    job = job_create(owner=owner, api=api, name="big", calls=calls(20_000))
    window = dispatch_window(api)
    # when the dispatcher runs again and again
    for _ in range(5):
        dispatch_api(api_id=api.pk)
    # expect: exactly one window of call messages in the broker, the rest waiting in the DB
    dispatched = Call.objects.filter(job=job, dispatched_at__isnull=False).count()
    in_broker = calls_in_broker(broker)
    print(f"window {window}: {dispatched} dispatched, {in_broker} call messages in the broker")
    assert window == 100
    assert dispatched == in_broker == window


def test_running_jobs_share_an_api_in_proportion_to_priority(broker, owner, unique_name):
    # given two jobs on one API, priorities 1 and 2, and room for 30 messages
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=15)
    low = job_create(owner=owner, api=api, name="low", calls=calls(500), priority=1)
    high = job_create(owner=owner, api=api, name="high", calls=calls(500), priority=2)
    dispatch_api(api_id=api.pk)
    # expect: the window split 1:2
    shares = {
        job.name: Call.objects.filter(job=job, dispatched_at__isnull=False).count()
        for job in (low, high)
    }
    assert shares == {"low": 10, "high": 20}


def test_a_paused_job_gives_its_place_to_the_others(broker, owner, unique_name):
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=8)
    first = job_create(owner=owner, api=api, name="first", calls=calls(100))
    second = job_create(owner=owner, api=api, name="second", calls=calls(100))
    job_pause(job=first)
    dispatch_api(api_id=api.pk)
    assert not Call.objects.filter(job=first, dispatched_at__isnull=False).exists()
    assert Call.objects.filter(job=second, dispatched_at__isnull=False).count() == 16


def test_a_job_paused_before_its_first_dispatch_gets_its_start_when_it_runs(
    broker, owner, unique_name
):
    # given a job paused before any call went out, then resumed
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=8)
    job = job_create(owner=owner, api=api, name="paused early", calls=calls(20))
    job_pause(job=job)
    job_resume(job=job)
    # when its first calls are dispatched
    dispatch_api(api_id=api.pk)
    # expect: it has a start, so its pace, ETA and chart count from there
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING and job.started is not None


def test_reconciler_redispatches_calls_whose_message_was_lost(broker, owner, unique_name, settings):
    # given a dispatched window whose messages vanished (Redis restarted without persistence)
    settings.RATEJOBS_STALE_DISPATCH_SECONDS = 0
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=8)
    job = job_create(owner=owner, api=api, name="lost", calls=calls(40))
    dispatch_api(api_id=api.pk)
    broker.delete(BROKER_QUEUE)
    # when the reconciler runs
    result = reconcile()
    # expect: the lost calls are dispatched again, with their messages back in the broker
    assert result.redispatched == 16
    assert Call.objects.filter(job=job, dispatched_at__isnull=False).count() == 16
    assert calls_in_broker(broker) >= 16
    assert Job.objects.get(pk=job.pk).status == "running"


def test_reconciler_cancels_a_call_taken_back_from_a_dead_worker_in_a_cancelled_job(
    broker, owner, unique_name
):
    # given a cancelled job whose one running call was on a worker that died
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=8)
    job = job_create(owner=owner, api=api, name="orphan", calls=calls(3))
    running = Call.objects.filter(job=job).order_by("index").first()
    Call.objects.filter(pk=running.pk).update(
        status="running", claim_token="t", claim_owner="gone:1", running_until=timezone.now()
    )
    job = job_cancel(job=job)
    assert (job.cancelled, Call.objects.get(pk=running.pk).status) == (2, "running")
    # when the reconciler takes the call back
    result = reconcile()
    # expect: it is cancelled too, and the job counts every call once
    job.refresh_from_db()
    assert (result.recovered, result.cancelled) == (1, 1)
    assert Call.objects.get(pk=running.pk).status == "cancelled"
    assert (job.cancelled, job.total, job.status) == (3, 3, "cancelled")


@pytest.mark.postgresql
def test_a_dispatch_running_while_a_job_is_paused_neither_deadlocks_nor_dispatches_it(
    broker, unique_name
):
    # given a job whose row is locked by a transaction that is about to pause it, and a
    # dispatch of its API starting at that moment (both lock the job and its calls)
    owner = get_user_model().objects.create_user("pauser", password="x")
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9", rate=100, burst=10)
    job = job_create(owner=owner, api=api, name="paused mid-dispatch", calls=[{"path": "/a"}] * 20)
    errors: list[BaseException] = []
    results = []
    dispatcher_pid: list[int] = []
    connected = threading.Event()

    def dispatch() -> None:
        try:
            dispatcher_pid.append(backend_pid())
            connected.set()
            results.append(dispatch_api(api_id=api.pk))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connected.set()
            connection.close()

    with transaction.atomic():
        Job.objects.select_for_update().get(pk=job.pk)
        dispatcher = threading.Thread(target=dispatch)
        dispatcher.start()
        assert connected.wait(LOCK_WAIT_TIMEOUT_SECONDS) and dispatcher_pid, errors
        # the dispatcher is under way: waiting for a lock this transaction holds (the job's)
        wait_until_blocked(dispatcher_pid[0], backend_pid())
        # when the pause goes on and commits
        try:
            job_pause(job=job)
        except BaseException as exc:
            errors.append(exc)
    dispatcher.join(30)
    # expect: no deadlock, and the paused job got no message
    assert errors == []
    assert Job.objects.get(pk=job.pk).status == "paused"
    assert results[0].dispatched == 0
    assert not Call.objects.filter(job=job, dispatched_at__isnull=False).exists()


def test_calls_a_dead_worker_dispatched_go_back_and_the_others_stay(
    broker, owner, unique_name, monkeypatch
):
    # given three worker processes' dispatches, as the dispatch task marks them: one process
    # alive, one dead since (it may have died between marking its calls and sending their
    # messages), and beat's reconciler, which names no process
    from datetime import timedelta

    from ratejobs.infra.clock import database_now
    from ratejobs.models import WorkerProcess
    from ratejobs.worker import reconcile as reconciling

    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=1)
    now = database_now()
    for owner_name, seen in (("vm:1:alive", now), ("vm:2:dead", now - timedelta(hours=1))):
        WorkerProcess.objects.create(owner=owner_name, host="vm", pid=1, started=seen, seen_at=seen)
    marked = {}
    for dispatcher in ("vm:1:alive", "vm:2:dead", ""):
        job = job_create(owner=owner, api=api, name=dispatcher or "beat", calls=calls(2))
        assert dispatch_api(api_id=api.pk, dispatcher=dispatcher).dispatched == 2
        marked[dispatcher] = job
        assert set(job.calls.values_list("claim_owner", flat=True)) == {dispatcher}
    # when a worker's sweep looks for what dead processes left
    requested = []
    monkeypatch.setattr(reconciling, "request_dispatch", requested.append)
    assert reconciling.calls_recover_orphans() == 2
    # expect: the dead dispatcher's calls are out of the window and asked to be dispatched again;
    # the live one's and beat's wait for their messages
    assert set(marked["vm:2:dead"].calls.values_list("dispatched_at", "claim_owner")) == {
        (None, "")
    }
    assert requested == [api.pk]
    for dispatcher in ("vm:1:alive", ""):
        assert not marked[dispatcher].calls.filter(dispatched_at__isnull=True).exists()


def test_a_capped_api_gets_the_calls_its_places_carried_lately(broker, owner, unique_name):
    # given an API with 4 places and a job of 1,000 calls that has just started
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=1000, max_concurrency=4)
    job = job_create(owner=owner, api=api, name="capped", calls=calls(1000))
    now = database_now()
    # expect: twice its cap while nothing has ended yet
    assert capped_window(api, now) == 8
    dispatch_api(api_id=api.pk)
    assert Call.objects.filter(job=job, dispatched_at__isnull=False).count() == 8
    # and, once its places carried 300 calls over the last 3 s, what they carry in twice a
    # worker's wait for a place (1 s): 100/s, so 200
    second = now.replace(microsecond=0)
    Job.objects.filter(pk=job.pk).update(started=now - timedelta(seconds=5))
    JobSecond.objects.create(job=job, at=now - timedelta(seconds=3), calls=300)
    assert capped_window(api, now) == 200
    # and a job that started a second ago ramps up at once: 100 calls so far are 100/s, not a
    # third of it
    JobSecond.objects.filter(job=job).update(at=second, calls=100)
    Job.objects.filter(pk=job.pk).update(started=now - timedelta(seconds=1))
    assert capped_window(api, now) == 200
    # and one that started half a second ago is measured from its start, not over a whole
    # second: 100 calls are 200/s
    Job.objects.filter(pk=job.pk).update(started=now - timedelta(seconds=0.5))
    assert capped_window(api, now) == 400
    # and calls long ago count for nothing
    JobSecond.objects.filter(job=job).update(at=now - timedelta(minutes=5))
    assert capped_window(api, now) == 8


def test_an_adaptive_api_cut_below_its_ceiling_gets_a_window_of_its_cut_rate(
    broker, owner, unique_name
):
    # given an adaptive API whose ceiling is 100/s (a window of 200) and whose limiter a 429
    # has cut
    api = api_create(
        name=unique_name, base_url="http://127.0.0.1:9/", rate=100, adaptive=True, min_rate=10
    )
    job = job_create(owner=owner, api=api, name="cut", calls=calls(1000))
    limiter = api_limiter(api)
    limiter.report_throttle(None)
    state = limiter.state()
    assert state.current_rate < 100
    cut = state.current_rate / state.period
    # when the dispatcher runs after the block
    time.sleep(state.blocked_for)
    dispatch_api(api_id=api.pk)
    # expect: two seconds of the cut rate in the broker, not two seconds of the ceiling: each
    # call beyond what the limiter grants within a worker's wait would come straight back
    dispatched = Call.objects.filter(job=job, dispatched_at__isnull=False).count()
    assert dispatched == dispatch_window(api, per_second=cut) < dispatch_window(api) == 200


def test_nothing_is_dispatched_while_the_api_is_blocked(broker, owner, unique_name):
    # given an API blocked for 30 s (a 429's Retry-After) and a job waiting
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=50)
    job = job_create(owner=owner, api=api, name="blocked", calls=calls(300))
    api_limiter(api).block(30)
    # when the dispatcher runs
    result = dispatch_api(api_id=api.pk)
    # expect: no call leaves the database (each would find its slot after the block), and a
    # wake-up when the block ends
    assert result.dispatched == 0
    assert not Call.objects.filter(job=job, dispatched_at__isnull=False).exists()
    assert result.next_due is not None
    assert 25 < (result.next_due - database_now()).total_seconds() <= 30
    # and once the block is lifted, a whole window goes
    api_limiter(api).reset()
    assert dispatch_api(api_id=api.pk).dispatched == dispatch_window(api)


def test_when_the_limiter_is_booked_ahead_only_what_starts_within_a_wait_is_dispatched(
    broker, owner, unique_name, settings
):
    # given an API at 10/s (burst 1) whose limiter has its slots booked about 0.7 s ahead
    # (calls already claimed wait for them), and a job waiting
    settings.RATEJOBS_MAX_WORKER_WAIT = 1.0
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=10, burst=1)
    job = job_create(owner=owner, api=api, name="booked", calls=calls(300))
    booked = api_limiter(api).acquire_many(8, max_wait=5.0)
    assert len(booked) == 8
    # when the dispatcher runs
    result = dispatch_api(api_id=api.pk)
    # expect: about the 3 calls that top the bookings up to a worker's wait (10/s x 0.3 s),
    # not a window of 2 s of work (20): the others would come straight back from the claim
    sent = Call.objects.filter(job=job, dispatched_at__isnull=False).count()
    assert result.dispatched == sent
    assert 1 <= sent <= 5, sent
    # and when the bookings fill the whole wait, nothing, with a look again when they no
    # longer do
    api_limiter(api).acquire_many(15, max_wait=5.0)
    result = dispatch_api(api_id=api.pk)
    assert result.dispatched == 0 and result.next_due is not None
    assert Call.objects.filter(job=job, dispatched_at__isnull=False).count() == sent


@pytest.mark.parametrize("credentials", [0, 1], ids=["no credentials", "a credential"])
def test_a_dispatch_run_asks_once_whether_the_api_has_credentials(
    broker, owner, unique_name, credentials: int
):
    # given an API with or without a credential, and a job waiting
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=8)
    if credentials:
        credentials_add(api=api, items=[("acme", "secret")])
    job = job_create(owner=owner, api=api, name="asks once", calls=calls(40))
    # when the dispatcher runs
    with CaptureQueriesContext(connection) as queries:
        result = dispatch_api(api_id=api.pk)
    # expect: one look at the credential table, whose answer both the pace (read before the
    # API's lock) and the window's buckets (counted under it) go by; and a window dispatched
    table = f'"{ApiCredential._meta.db_table}"'
    asked = [query["sql"] for query in queries.captured_queries if table in query["sql"]]
    assert len(asked) == 1, asked
    assert result.dispatched == dispatch_window(api) == 16
    assert Call.objects.filter(job=job, dispatched_at__isnull=False).count() == 16
