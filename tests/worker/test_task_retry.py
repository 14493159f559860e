"""A message of calls that meets a database restart is sent again, not dropped: dropped, its calls
would wait in the dispatch window until the reconciler found them stale (found by `make chaos`,
postgres-restart row)."""

from __future__ import annotations

import pytest
from django.db import InterfaceError, OperationalError

from ratejobs import tasks


@pytest.mark.parametrize(
    "error",
    [
        OperationalError("server closed the connection unexpectedly"),
        InterfaceError("connection already closed"),
    ],
)
def test_a_claim_that_meets_a_database_restart_is_tried_again(monkeypatch, error):
    # given: every claim fails as it does while PostgreSQL restarts
    attempts = []

    def claim_fails(**kwargs):
        attempts.append(kwargs)
        raise error

    monkeypatch.setattr(tasks, "calls_start", claim_fails)
    # expect: the message runs again (eagerly here; from the broker, seconds apart, in a worker)
    # until its retries are spent, and only then fails
    result = tasks.execute_calls.apply(args=[7, [1, 2]])
    assert result.state == "FAILURE"
    assert len(attempts) == 1 + tasks.execute_calls.max_retries
    assert all(a == {"job_id": 7, "call_ids": [1, 2]} for a in attempts)


def test_any_other_error_is_not_retried(monkeypatch):
    attempts = []

    def bug(**kwargs):
        attempts.append(kwargs)
        raise ValueError("a bug, not an outage")

    monkeypatch.setattr(tasks, "calls_start", bug)
    assert tasks.execute_calls.apply(args=[7, [1]]).state == "FAILURE"
    assert len(attempts) == 1
