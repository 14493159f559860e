"""A broker that restarted lost its messages: the reconciler dispatches their calls again at its
next run, not after RATEJOBS_STALE_DISPATCH_SECONDS."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest

from devtools.devredis import start_private_redis
from ratejobs.infra.clock import database_now
from ratejobs.models import Call
from ratejobs.worker.reconcile import broker_restarted, reconcile


@pytest.mark.django_db
def test_calls_of_a_restarted_broker_are_dispatched_again_at_the_next_run(
    make_job: Any, settings: Any, services_redis: None
) -> None:
    broker = start_private_redis()
    try:
        settings.CELERY_BROKER_URL = broker.url
        settings.RATEJOBS_STALE_DISPATCH_SECONDS = 3600
        assert broker_restarted()  # the first look: nothing seen before
        # given 5 calls whose messages are in the broker (dispatched a moment ago)
        job = make_job(calls=5)
        Call.objects.filter(job=job).update(dispatched_at=database_now())
        assert reconcile().redispatched == 0
        # when the broker restarts with nothing persisted
        port = urlsplit(broker.url).port
        broker.stop()
        broker = start_private_redis(port=port)
        # expect: all 5 dispatched again at the next run, and only then
        assert reconcile().redispatched == 5
        Call.objects.filter(job=job).update(dispatched_at=database_now())
        assert reconcile().redispatched == 0
    finally:
        broker.stop()
