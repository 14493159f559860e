"""One clock for every process: the database's."""

from __future__ import annotations

from datetime import datetime

from django.db import connection
from django.utils import timezone


def database_now() -> datetime:
    """The database's time: whether a call is due, and how long a claim or a heartbeat lasts,
    is judged on this one clock, never on each worker's own (which may be minutes off)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]
    # SQLite is a file on this machine: its clock is this machine's.
    return timezone.now()
