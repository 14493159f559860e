"""The worker runs ratejobs' consumer: Celery's, surviving the close of a lost broker
connection (ratejobs/worker/consumer.py; the end-to-end proof is the Redis-restart test in
tests/jobs/test_end_to_end_own_workers.py)."""

from __future__ import annotations

from celery.utils.imports import symbol_by_name
from celery.worker.consumer import Consumer as CeleryConsumer

from project.celery import app
from ratejobs.worker.consumer import Consumer


def test_the_app_runs_ratejobs_consumer_which_is_celerys():
    assert symbol_by_name(app.conf.worker_consumer) is Consumer
    assert issubclass(Consumer, CeleryConsumer)
