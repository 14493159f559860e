"""Worker processes as the database sees them: heartbeats that tell a live claim from one
whose process died (on the database's clock, ratejobs.infra.clock)."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Q

from ratejobs.infra.clock import database_now
from ratejobs.models import WorkerProcess

_owner: tuple[int, str] | None = None


def process_owner() -> str:
    """This process's name for its claims, made once per process (a forked child makes its
    own): host and pid help a reader find it, the random part tells apart containers sharing
    both."""
    global _owner
    if _owner is None or _owner[0] != os.getpid():
        _owner = (os.getpid(), f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}")
    return _owner[1]


def worker_heartbeat(*, owner: str) -> None:
    now = database_now()
    host, pid, _ = owner.rsplit(":", 2)
    WorkerProcess.objects.bulk_create(  # one upsert
        [WorkerProcess(owner=owner, host=host, pid=int(pid), started=now, seen_at=now)],
        update_conflicts=True,
        unique_fields=["owner"],
        update_fields=["seen_at"],
    )


def worker_forget(*, owner: str) -> None:
    WorkerProcess.objects.filter(owner=owner).delete()


def owner_is_dead(now: datetime) -> Q:
    """Calls whose claiming process sent no heartbeat for RATEJOBS_WORKER_DEAD_AFTER seconds
    (or never had one: a row from before heartbeats, or a process forgotten at its exit)."""
    alive = WorkerProcess.objects.filter(
        seen_at__gte=now - timedelta(seconds=settings.RATEJOBS_WORKER_DEAD_AFTER)
    ).values("owner")
    return ~Q(claim_owner__in=alive)


def workers_alive(now: datetime) -> int:
    """Worker processes that sent a heartbeat within RATEJOBS_WORKER_DEAD_AFTER seconds."""
    return WorkerProcess.objects.filter(
        seen_at__gte=now - timedelta(seconds=settings.RATEJOBS_WORKER_DEAD_AFTER)
    ).count()


def workers_forget_long_gone(now: datetime) -> int:
    """Drop heartbeats of processes gone for a day: nothing can still hold their claims."""
    return WorkerProcess.objects.filter(seen_at__lt=now - timedelta(days=1)).delete()[0]
