"""Asking the workers for a dispatch run of an API: a debounced message by task name (celery's
send_task), so that whoever asks (a new job, a finished call, the reconciler, the dispatch run
itself) needs nothing of the tasks or of the worker's machinery.

A run asked for later is sent later, timed on this process's monotonic clock, never as a
Celery countdown: a countdown is an ETA on the sender's wall clock, and the worker that takes
it holds it until its own wall clock gets there. With hosts 30 s apart (bench/scale), a 0.25 s
debounce was held for up to 60 s, or ran at once before it was due, and a job waiting for its
wake-up started 24 to 26 s late. A message not yet sent is lost with its process; the
reconciler sends what is due."""

from __future__ import annotations

import logging
import threading
from datetime import datetime

import redis
from celery import current_app
from django.db import DatabaseError

from ratejobs.celery_settings import DISPATCH_TASK
from ratejobs.infra.clock import database_now
from ratejobs.infra.connections import redis_client
from ratejobs.models import Api
from ratejobs.namespace import redis_key

logger = logging.getLogger(__name__)

# Completions within this long share one dispatch run: the window holds seconds of work, so a
# quarter second of delay costs nothing and saves a dispatch query per call.
DISPATCH_DEBOUNCE_SECONDS = 0.25
# Calls waiting for a later attempt are looked at again at least this often. Countdowns stay
# short: a Redis broker redelivers a long-delayed task after its visibility timeout.
MAX_WAKEUP_SECONDS = 5.0


def dispatch_key(api_id: int, part: str) -> str:
    """The API's dispatch key `part`, under its limiter's hash tag (its name): on a Redis
    Cluster it lives on the node of the API's limiter. With the id as the tag, a node down
    held the debounce keys of APIs whose limiters were elsewhere, and their calls waited for
    the reconciler while the node was away (bench/scale's cluster-node-restart: the other
    API at 0.40 of its rate); now a node down stops the dispatch only of the APIs whose
    limiters it holds, whose calls wait anyway (a limiter fails closed).

    The name is read each time (a primary-key lookup), not cached by id: SQLite gives a
    deleted API's id to the next one, and a name cached for the old one would put the new
    one's requests under another key than the other processes use."""
    try:
        name = Api.objects.filter(pk=api_id).values_list("name", flat=True).first()
    except DatabaseError:  # asked for anyway; the reconciler covers what this loses
        name = None
    tag = str(api_id) if name is None else name
    return redis_key("dispatch", f"{{{tag}}}", part)


def request_dispatch(api_id: int, *, countdown: float = DISPATCH_DEBOUNCE_SECONDS) -> None:
    """Ask for a dispatch run of the API within `countdown` seconds; requests within the
    debounce time share one run."""
    try:
        # The requests share the run until it starts: a run asked for at once (a new job's)
        # must not swallow the requests of calls that finish while it runs, or an API with an
        # in-flight cap, whose window holds only a few calls, waits for the reconciler.
        first = redis_client().set(
            dispatch_key(api_id, "pending"),
            1,
            nx=True,
            px=max(1, int(min(countdown, DISPATCH_DEBOUNCE_SECONDS) * 1000)),
        )
        if first:
            _dispatch_later(api_id, countdown)
    except (redis.RedisError, OSError):
        logger.warning("Redis unreachable: dispatch of API %s left to the reconciler", api_id)


def schedule_wakeup(api_id: int, next_due: datetime | None) -> None:
    """Dispatch again when the earliest waiting call is due (in steps of at most a few s)."""
    if next_due is None:
        return
    delay = min(max((next_due - database_now()).total_seconds(), 0.05), MAX_WAKEUP_SECONDS)
    try:
        if redis_client().set(dispatch_key(api_id, "wakeup"), 1, nx=True, px=int(delay * 1000)):
            _dispatch_later(api_id, delay)
    except Exception:
        logger.warning("could not schedule a wake-up of API %s; the reconciler will", api_id)


def _dispatch_later(api_id: int, delay: float) -> None:
    """Send the API's dispatch task in `delay` seconds (at once for 0)."""
    if delay <= 0:
        _send_dispatch(api_id)
        return
    timer = threading.Timer(delay, _send_dispatch, args=(api_id,))
    timer.daemon = True  # a process ending does not wait for it: the reconciler covers
    timer.start()


def _send_dispatch(api_id: int) -> None:
    try:
        current_app.send_task(DISPATCH_TASK, args=[api_id])
    except Exception:  # the broker (also Redis by default) refused the message
        logger.exception("could not request a dispatch of API %s", api_id)
