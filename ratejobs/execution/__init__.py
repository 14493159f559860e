"""HTTP execution of one call: build the request, send it within the shared limiter, classify
the response (no Django, no Celery)."""

from __future__ import annotations

from ratejobs.execution.attempt import (
    ExecutionPolicy,
    Outcome,
    OutcomeKind,
    attempt_call,
)
from ratejobs.execution.backoff import backoff_ceiling, full_jitter
from ratejobs.execution.connections import session_for_process
from ratejobs.execution.http import HttpResult, send
from ratejobs.execution.outcome import Decision, DecisionKind, classify
from ratejobs.execution.request import HttpRequest, build_request
from ratejobs.execution.targets import (
    check_headers,
    resolve_url,
    validate_base_url,
    validate_method,
)

__all__ = [
    "Decision",
    "DecisionKind",
    "ExecutionPolicy",
    "HttpRequest",
    "HttpResult",
    "Outcome",
    "OutcomeKind",
    "backoff_ceiling",
    "build_request",
    "check_headers",
    "classify",
    "attempt_call",
    "full_jitter",
    "resolve_url",
    "send",
    "session_for_process",
    "validate_base_url",
    "validate_method",
]
