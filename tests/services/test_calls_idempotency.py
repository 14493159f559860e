"""Idempotency keys on the wire: every attempt of a call carries the same key, so an API that
deduplicates by it acts on the call once, however often it is sent."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from ratejobs.models import Call
from ratejobs.services.apis import api_create
from ratejobs.services.calls import (
    call_attempt,
    call_attempt_by_id,
    call_idempotency_key,
    calls_claim,
)
from ratejobs.services.jobs import job_create
from tests.services.test_calls import broker  # noqa: F401 (fixture)

pytestmark = pytest.mark.django_db(transaction=True)

HEADER = "Idempotency-Key"


def make_due(call: Call) -> None:
    """What dispatch does for a call whose next attempt is due."""
    Call.objects.filter(pk=call.pk).update(dispatched_at=timezone.now(), next_attempt_at=None)


def keys_by_path(server) -> dict[str, list[str | None]]:
    keys = defaultdict(list)
    for entry in server.stats(detail=True)["log"]:
        keys[entry["path"]].append(entry["idempotency_key"])
    return dict(keys)


def test_every_attempt_of_a_call_carries_its_key_and_a_resend_is_answered_once(
    broker,  # noqa: F811 (fixture)
    sandbox,
    unique_name,
):
    # given an API with an idempotency header, and a server answering 500 for now (500s are
    # not remembered by key, so each of those attempts arrives)
    server = sandbox(rate=100, burst=10, error_rate=1.0, headers="none")
    owner = get_user_model().objects.create_user("keys", password="x")
    api = api_create(
        name=unique_name, base_url=server.url, rate=100, burst=10, idempotency_header=HEADER
    )
    job = job_create(owner=owner, api=api, name="keys", calls=[{"path": "/a"}, {"path": "/b"}])
    first, second = Call.objects.filter(job=job).order_by("index")
    # when each call is tried twice and retried, then the server recovers
    for call in (first, second, first, second):
        make_due(call)
        assert call_attempt_by_id(call_id=call.pk) == "retry"
    server.configure(error_rate=0.0)
    # and the first call is answered but its worker dies before writing the answer down, so
    # its claim runs out and it is sent once more
    make_due(first)
    lost = calls_claim(job_id=job.pk, call_ids=[first.pk], owner="a-process-about-to-die")
    assert call_attempt(lost[0]).kind == "succeeded"
    Call.objects.filter(pk=first.pk).update(running_until=timezone.now() - timedelta(seconds=1))
    assert call_attempt_by_id(call_id=first.pk) == "succeeded"
    make_due(second)
    assert call_attempt_by_id(call_id=second.pk) == "succeeded"
    # expect: every attempt of a call carried the same key, <job uuid>-<index>, and the resend
    # got the first answer again instead of being acted on twice
    job.refresh_from_db()
    assert call_idempotency_key(first) == f"{job.uuid}-0"
    assert keys_by_path(server) == {"/a": [f"{job.uuid}-0"] * 3, "/b": [f"{job.uuid}-1"] * 3}
    stats = server.stats()
    assert (stats["arrivals"], stats["idempotent_replays"], stats["unique_keys"]) == (6, 1, 2)
    first.refresh_from_db()
    assert (first.status, first.attempts, job.succeeded, job.status) == (
        "succeeded",
        3,
        2,
        "completed",
    )


def test_a_calls_own_key_wins_and_an_api_without_a_header_sends_none(
    broker,  # noqa: F811 (fixture)
    sandbox,
    unique_name,
):
    server = sandbox(rate=100, burst=10, headers="none")
    owner = get_user_model().objects.create_user("own-keys", password="x")
    keyed = api_create(
        name=unique_name, base_url=server.url, rate=100, burst=10, idempotency_header=HEADER
    )
    plain = api_create(name=unique_name + "-plain", base_url=server.url, rate=100, burst=10)
    own = {"path": "/own", "headers": {HEADER.lower(): "the-users-own-key"}}
    keyed_job = job_create(owner=owner, api=keyed, name="own", calls=[own, {"path": "/given"}])
    plain_job = job_create(owner=owner, api=plain, name="plain", calls=[{"path": "/none"}])
    for call in Call.objects.filter(job__in=[keyed_job, plain_job]):
        make_due(call)
        assert call_attempt_by_id(call_id=call.pk) == "succeeded"
    assert keys_by_path(server) == {
        "/own": ["the-users-own-key"],
        "/given": [f"{keyed_job.uuid}-1"],
        "/none": [None],
    }
