"""The Celery application: configured from the CELERY_* Django settings, tasks autodiscovered.
What a worker does around ratejobs' tasks comes with the app (ratejobs.worker.signals), as it
would in any host project's Celery app."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings.base")

app = Celery("project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
