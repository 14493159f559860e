"""The worker's consumer (Celery's `worker_consumer` setting): Celery's own, except that the
close of a broker connection that was lost cannot end the worker.

Celery 5.7, when the broker connection is lost after the worker connected, first calls
`connection.collect()`, which detaches the connection's transport (`transport.client = None`),
and then `connection.close()`. That close closes the default channel, and kombu's Redis channel
(plain Redis and Sentinel) restores its unacknowledged messages as it closes: our tasks are
acks_late, so every running task has one. The restore asks the transport's client for the
broker's address, finds None, and raises AttributeError. Celery guards the close only against
connection and channel errors, so the AttributeError reaches the worker's blueprint, which logs
"Unrecoverable error" and stops the worker's main process; a job then waits for a worker that
is gone. Celery 5.6 did not close the connection there.

Losing the restore costs nothing: the reconciler (`ratejobs.reconcile`, run by beat)
re-dispatches the calls of messages the broker lost, as it does when Redis restarts empty.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery.worker.consumer import Consumer as CeleryConsumer

logger = logging.getLogger(__name__)


class Consumer(CeleryConsumer):
    """Celery's consumer, surviving the close of a lost broker connection (module docstring)."""

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        connection = self.connection
        if connection is not None:
            # An instance attribute shadows kombu's `Connection.close` for this one connection,
            # the one Celery is about to close; the next connection is a new object and keeps
            # kombu's own.
            connection.close = _close_tolerating_detached_transport(connection.close)
        # Everything else stays Celery's: the retry warning, the cancelling of running
        # acks_late tasks, the prefetch reduction and the reconnect.
        super().on_connection_error_after_connected(exc)


def _close_tolerating_detached_transport(close: Callable[[], Any]) -> Callable[[], None]:
    """`close`, except that the AttributeError kombu raises when the lost connection's
    transport was detached before the close (module docstring) is logged, not raised."""

    def close_lost_connection() -> None:
        try:
            close()
        except AttributeError as error:
            logger.warning(
                "The lost broker connection could not be closed cleanly (%r): its "
                "unacknowledged messages were not restored here; ratejobs' reconciler "
                "re-dispatches their calls.",
                error,
            )

    return close_lost_connection
