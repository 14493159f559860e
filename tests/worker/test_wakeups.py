"""Dispatch runs asked for later are sent later by the asking process, never as a Celery
countdown: a countdown is an ETA on the sender's wall clock, held by the receiving worker until
its own wall clock reaches it (hosts 30 s apart held a 0.25 s debounce for up to a minute)."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
import redis
from redis.crc import key_slot

from ratejobs.celery_settings import CONTROL_QUEUE, DISPATCH_TASK
from ratejobs.infra.clock import database_now
from ratejobs.infra.connections import redis_client
from ratejobs.infra.limiters import api_limiter
from ratejobs.infra.wakeups import dispatch_key, request_dispatch, schedule_wakeup
from ratejobs.namespace import broker_key
from ratejobs.services.apis import api_create

pytestmark = pytest.mark.django_db(transaction=True)


def dispatch_messages(broker: redis.Redis, api_id: int) -> list[dict]:
    """The headers of the dispatch messages for the API waiting in the control queue."""
    found = []
    for raw in broker.lrange(broker_key(CONTROL_QUEUE), 0, -1):
        headers = json.loads(raw)["headers"]
        if headers["task"] == DISPATCH_TASK and headers["argsrepr"] == f"[{api_id}]":
            found.append(headers)
    return found


def wait_for_messages(broker: redis.Redis, api_id: int, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while not (found := dispatch_messages(broker, api_id)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


@pytest.mark.parametrize("ask", ["request_dispatch", "schedule_wakeup"])
def test_a_dispatch_asked_for_later_is_sent_later_without_an_eta(broker, unique_name, ask):
    # given an API
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=10)
    asked = time.monotonic()
    # when a dispatch run is asked for in 0.6 s
    if ask == "request_dispatch":
        request_dispatch(api.pk, countdown=0.6)
    else:
        schedule_wakeup(api.pk, database_now() + timedelta(seconds=0.6))
    # expect: nothing in the broker at first, then one message that any worker runs at once,
    # whatever its clock says (no ETA to compare with it)
    assert dispatch_messages(broker, api.pk) == []
    (message,) = wait_for_messages(broker, api.pk, timeout=5)
    assert time.monotonic() - asked >= 0.5
    assert message.get("eta") is None and message.get("countdown") is None


def test_a_dispatch_asked_for_now_is_sent_at_once(broker, unique_name):
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=10)
    request_dispatch(api.pk, countdown=0)
    (message,) = dispatch_messages(broker, api.pk)
    assert message.get("eta") is None


def test_a_dispatch_run_that_meets_a_database_error_is_retried():
    # a PgBouncer restart (make scale) failed dispatch runs, and a failed run schedules no
    # wake-up: retried as a call message is, since a second run is harmless
    from django.db import InterfaceError, OperationalError

    from ratejobs.tasks import dispatch, execute_calls

    assert set(dispatch.autoretry_for) == {OperationalError, InterfaceError}
    assert dispatch.max_retries == execute_calls.max_retries


def test_an_apis_dispatch_keys_share_the_node_of_its_limiter(broker, unique_name):
    # given an API and its limiter's keys
    api = api_create(name=unique_name, base_url="http://127.0.0.1:9/", rate=10)
    limiter = api_limiter(api)
    # when a dispatch run and a wake-up are asked for
    request_dispatch(api.pk, countdown=0.5)
    schedule_wakeup(api.pk, database_now() + timedelta(seconds=0.5))
    # expect: their debounce keys are in Redis, in the hash slot of the limiter's keys (on a
    # Redis Cluster, one node), and that slot is the API's own, not another API's
    client = redis_client()
    keys = [dispatch_key(api.pk, "pending"), dispatch_key(api.pk, "wakeup")]
    assert all(client.exists(key) for key in keys)
    assert {key_slot(key.encode()) for key in keys} == {key_slot(limiter.state_key.encode())}
    other = api_create(name=f"{unique_name}-other", base_url="http://127.0.0.1:9/", rate=10)
    assert key_slot(dispatch_key(other.pk, "pending").encode()) == key_slot(
        api_limiter(other).state_key.encode()
    )
