"""The bare Celery baseline of bench.jobs: the task a user writes without ratejobs, one GET and
one row UPDATE. The worker loads it with `-I bench.bare_tasks`."""

from __future__ import annotations

import time

import requests
from celery import shared_task
from django.utils import timezone

from ratejobs.models import Call

# One session per process, as a user would keep it: made at import, before the prefork pool
# forks, while it holds no connection yet, so every child opens its own.
session = requests.Session()
# A user who remembers a timeout at all writes one like this; it never fires against the sandbox.
TIMEOUT_SECONDS = 30


@shared_task(name="bench.bare_call")
def bare_call(call_id: int, url: str) -> None:
    started = time.monotonic()
    response = session.get(url, timeout=TIMEOUT_SECONDS)
    # One UPDATE of one row; duration and finished ride along so the benchmark can time it.
    Call.objects.filter(pk=call_id).update(
        status_code=response.status_code,
        duration=time.monotonic() - started,
        finished=timezone.now(),
    )
