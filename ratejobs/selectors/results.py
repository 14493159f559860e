"""A job's results as a file, JSON lines or CSV: every call in index order, streamed in constant
memory, the one row format behind the REST download, the admin's button and export_results."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.http import StreamingHttpResponse

from ratejobs.models import Call, Job
from ratejobs.selectors.jobs import response_body_output

# What each row says, in this order (CSV's header line, JSON's keys): the body as the REST call
# pages present it, base64 when binary, and response_removed_at when retention removed it;
# credential_key is the key the call was sent with (its own, else its job's; empty: the API's);
# cost is the estimate given at submission, cost_used what the API said it used (null: unsaid).
RESULT_FIELDS = (
    "index",
    "method",
    "path",
    "status",
    "status_code",
    "attempts",
    "duration",
    "cost",
    "cost_used",
    "error",
    "response_body",
    "response_body_base64",
    "response_truncated",
    "response_removed_at",
    "credential_key",
)
# What is read: the same, but whether the body is base64, which is worked out from the body.
_COLUMNS = tuple(name for name in RESULT_FIELDS if name != "response_body_base64")
# Rows held at once are bounded by bytes, not by count: a stored body may be as large as
# RATEJOBS_MAX_RESPONSE_BYTES (1 MiB), so the rows fetched per round trip are this budget
# divided by that cap, within these bounds (64 rows for the defaults).
FETCH_BUDGET_BYTES = 64 * 1024 * 1024
MIN_FETCH_ROWS = 16
MAX_FETCH_ROWS = 2000
# The response is written in pieces of about this size: one syscall per few hundred rows,
# not one per row.
PIECE_BYTES = 256 * 1024


def _fetch_rows() -> int:
    per_row = max(settings.RATEJOBS_MAX_RESPONSE_BYTES, 1)
    return max(MIN_FETCH_ROWS, min(MAX_FETCH_ROWS, FETCH_BUDGET_BYTES // per_row))


def call_result_rows(job: Job) -> Iterator[tuple[Any, ...]]:
    """The job's calls in index order as tuples of RESULT_FIELDS (times as ISO 8601 text), read
    through a server-side cursor (PostgreSQL) or in chunks (SQLite), never all at once."""
    rows = (
        Call.objects.filter(job_id=job.pk)
        .order_by("index")
        .values_list(*_COLUMNS)
        .iterator(chunk_size=_fetch_rows())
    )
    # PostgreSQL: outside a transaction Django declares the cursor WITH HOLD, and the server
    # then computes the whole result (a temporary file of the job's bodies) before the first
    # row; inside one, rows come as they are read. SQLite's transactions here are IMMEDIATE
    # (they take the write lock), and its cursor reads step by step without one.
    within = transaction.atomic() if connection.vendor == "postgresql" else contextlib.nullcontext()
    with within:
        for *call, body, truncated, removed, key in rows:
            text, is_base64 = response_body_output(body, truncated=truncated)
            yield (*call, text, is_base64, truncated, _moment(removed), key or job.credential_key)


def _moment(value: datetime | None) -> str | None:
    """As the REST API writes a time (DRF): ISO 8601, UTC as Z."""
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _pieces(lines: Iterable[str]) -> Iterator[bytes]:
    """Lines joined into pieces of about PIECE_BYTES, UTF-8."""
    held: list[str] = []
    size = 0
    for line in lines:
        held.append(line)
        size += len(line)
        if size >= PIECE_BYTES:
            yield "".join(held).encode()
            held, size = [], 0
    if held:
        yield "".join(held).encode()


def results_jsonl(rows: Iterable[tuple[Any, ...]]) -> Iterator[bytes]:
    """One JSON object a line, keys as RESULT_FIELDS."""
    encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
    return _pieces(encode(dict(zip(RESULT_FIELDS, row, strict=True))) + "\n" for row in rows)


def results_csv(rows: Iterable[tuple[Any, ...]]) -> Iterator[bytes]:
    """A header line of RESULT_FIELDS, then a line a call: empty for null, true/false."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def lines() -> Iterator[str]:
        yield ",".join(RESULT_FIELDS) + "\r\n"  # plain names: nothing to quote
        for (index, method, path, status, code, attempts, duration, cost, cost_used, error,
             body, is_base64, cut, removed, key) in rows:  # fmt: skip
            writer.writerow(
                (index, method, path, status, code, attempts, duration, cost, cost_used, error,
                 body, _flag(is_base64), _flag(cut), removed, key)
            )  # fmt: skip
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()

    return _pieces(lines())


def _flag(value: bool) -> str:
    return "true" if value else "false"


@dataclass(frozen=True)
class ResultsFormat:
    name: str  # the file's extension, and what --format takes
    media_type: str
    write: Callable[[Iterable[tuple[Any, ...]]], Iterator[bytes]]


RESULTS_FORMATS = {
    "jsonl": ResultsFormat("jsonl", "application/x-ndjson", results_jsonl),
    "csv": ResultsFormat("csv", "text/csv; charset=utf-8", results_csv),
}


def job_results(job: Job, format: str) -> Iterator[bytes]:
    """The job's results file in `format` (a key of RESULTS_FORMATS), piece by piece."""
    return RESULTS_FORMATS[format].write(call_result_rows(job))


def job_results_response(job: Job, format: str) -> StreamingHttpResponse:
    """The download the REST API and the admin both serve: an attachment, streamed."""
    response = StreamingHttpResponse(
        job_results(job, format), content_type=RESULTS_FORMATS[format].media_type
    )
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-results.{format}"'
    return response
