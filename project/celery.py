"""The Celery application: configured from the CELERY_* Django settings, tasks autodiscovered."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery, Task
from celery.signals import after_setup_logger, after_setup_task_logger, task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.base")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def close_old_database_connections(task: Task | None = None, **_: Any) -> None:
    """What Django does around each request: drop connections that broke or outlived
    CONN_MAX_AGE, keep the rest (CELERY_DB_REUSE_MAX stops the fixup closing them all)."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    from django.db import close_old_connections

    close_old_connections()


@after_setup_logger.connect
@after_setup_task_logger.connect
def use_the_configured_log_format(logger: Any, **_: Any) -> None:
    """Celery installs its own handlers on the worker's loggers; give them our format when it
    is JSON, so that a worker's log is one JSON object per line like the web's."""
    from django.conf import settings

    if settings.RATEJOBS_LOG_FORMAT != "json":
        return
    from ratejobs.logs import json_formatter

    for handler in logger.handlers:
        handler.setFormatter(json_formatter())
