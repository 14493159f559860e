"""What a worker process of any Celery app running ratejobs' tasks does around them: connected
when the app is ready (RatejobsConfig), so a host project's own `celery -A <project> worker`
gets it with no line of its own."""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from celery.signals import (
    after_setup_logger,
    after_setup_task_logger,
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
)

# How long a stopping pool process waits for its calls in flight: the longest request
# (total timeout 60 s) and the time to write its outcome.
ENGINE_STOP_SECONDS = 70.0


def connect() -> None:
    """Connect the handlers below; Celery's signals hold them weakly unless told otherwise."""
    task_prerun.connect(close_old_database_connections, weak=False)
    task_postrun.connect(close_old_database_connections, weak=False)
    worker_process_init.connect(start_the_engine, weak=False)
    worker_process_shutdown.connect(finish_calls_in_flight, weak=False)
    after_setup_logger.connect(use_the_configured_log_format, weak=False)
    after_setup_task_logger.connect(use_the_configured_log_format, weak=False)


def close_old_database_connections(task: Task | None = None, **_: Any) -> None:
    """What Django does around each request: drop connections that broke or outlived
    CONN_MAX_AGE, keep the rest (CELERY_DB_REUSE_MAX stops Celery's fixup closing them all)."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


def start_the_engine(**_: Any) -> None:
    """Every pool process sends heartbeats and sweeps for dead workers' calls from its start,
    not from its first message: after a kill -9 of every pool process, the calls they held
    can be all that is left of a job, and no message would come to start a new one."""
    from ratejobs.worker.engine import engine

    try:
        engine()
    except Exception:  # the database is not there yet: the first message starts it
        logging.getLogger(__name__).exception("could not start the engine")


def finish_calls_in_flight(**_: Any) -> None:
    """A pool process ends (warm shutdown, max tasks per child): its tasks have returned, but
    the calls they started may still be in flight on its threads. Let them finish and be
    recorded rather than be taken back later and sent twice."""
    from ratejobs.worker.engine import engine_stop

    engine_stop(timeout=ENGINE_STOP_SECONDS)


def use_the_configured_log_format(logger: Any, **_: Any) -> None:
    """Celery installs its own handlers on the worker's loggers; give them our format when it
    is JSON, so that a worker's log is one JSON object per line like the web's."""
    from django.conf import settings

    if settings.RATEJOBS_LOG_FORMAT != "json":
        return
    from ratejobs.logs import json_formatter

    for handler in logger.handlers:
        handler.setFormatter(json_formatter())
