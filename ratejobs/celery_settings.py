"""What a Celery app running ratejobs' tasks needs from its configuration: the queue the control
tasks go to, their routes, the worker's consumer, beat's schedule and the broker's key prefix.

A host project adds these to its own Celery settings (docs/install.md); `project/settings`
does the same. Importable from a settings module: nothing here touches Django's settings.
"""

from __future__ import annotations

from typing import Any

from kombu import Queue

from ratejobs import conf

EXECUTE_CALLS_TASK = "ratejobs.execute_calls"
DISPATCH_TASK = "ratejobs.dispatch"
RECONCILE_TASK = "ratejobs.reconcile"
RETENTION_TASK = "ratejobs.retention"
PURGE_TASK = "ratejobs.purge_jobs"
CALLBACK_TASK = "ratejobs.job_callback"

# Dispatch, reconcile and retention have their own queue: behind a window of call messages in
# the default queue they would wait seconds and the window would run dry. A worker consumes it
# when it is among the app's task_queues (a plain `celery -A <project> worker` then takes both).
CONTROL_QUEUE = "ratejobs.control"
RATEJOBS_TASK_QUEUES = [Queue(CONTROL_QUEUE)]
RATEJOBS_TASK_ROUTES = {
    name: {"queue": CONTROL_QUEUE}
    for name in (DISPATCH_TASK, RECONCILE_TASK, RETENTION_TASK, PURGE_TASK)
}

# The worker's consumer (Celery's `worker_consumer`): Celery's own, except that closing a broker
# connection that was lost while acks_late tasks ran cannot end the worker (Celery 5.7 closes it
# after detaching its transport, and kombu's Redis transport then raises AttributeError;
# ratejobs/worker/consumer.py).
RATEJOBS_WORKER_CONSUMER = "ratejobs.worker.consumer:Consumer"


def ratejobs_beat_schedule(
    *, reconcile_interval: float | None = None, retention_interval: float | None = None
) -> dict[str, dict[str, Any]]:
    """Beat's entries: the reconciler (a safety net that re-dispatches calls whose message was
    lost; workers alone run jobs to completion) and retention (old events and bodies, and
    purges left halfway), every RATEJOBS_RECONCILE_INTERVAL and RATEJOBS_RETENTION_INTERVAL
    seconds (their defaults unless given)."""
    if reconcile_interval is None:
        reconcile_interval = conf.default("RATEJOBS_RECONCILE_INTERVAL")
    if retention_interval is None:
        retention_interval = conf.default("RATEJOBS_RETENTION_INTERVAL")
    return {
        "ratejobs-reconcile": {"task": RECONCILE_TASK, "schedule": reconcile_interval},
        "ratejobs-retention": {"task": RETENTION_TASK, "schedule": retention_interval},
    }


def broker_key_prefix(namespace: str) -> str:
    """kombu's Redis transport option `global_keyprefix`: the broker's queues, bindings and
    unacknowledged messages under the deployment's namespace, so two deployments on one Redis
    never take each other's tasks."""
    return f"ratejobs:{namespace}:broker:"
