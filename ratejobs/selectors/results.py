"""A job's results as a file, JSON lines or CSV: every call in index order, streamed in constant
memory, the one row format behind the REST download, the admin's button and export_results."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Case, F, QuerySet, RowRange, Sum, When, Window
from django.db.models.functions import Coalesce, Length
from django.http import StreamingHttpResponse

from ratejobs.models import Call, Job
from ratejobs.selectors.jobs import response_body_output

# What each row says, in this order (CSV's header line, JSON's keys): the body as the REST call
# pages present it, base64 when binary, and response_removed_at when retention removed it;
# credential_key is the key the call was sent with (its own, else its job's; empty: the API's);
# cost is the estimate given at submission, cost_used what the API said it used (null: unsaid).
# duration is the last request's seconds, exactly as stored (kept for the files read before
# duration_ms came), duration_ms the same in milliseconds to a tenth; query the call's query
# parameters (JSON text in CSV). Columns are only ever added at the end, so a reader that takes
# the columns by position keeps working.
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
    "query",
    "duration_ms",
)
# What is read for each call, in this order; the rest of a row is worked out from it.
_LEADING = RESULT_FIELDS[: RESULT_FIELDS.index("response_body")]
_COLUMNS = (
    *_LEADING,
    "response_body",
    "response_truncated",
    "response_removed_at",
    "credential_key",
    "query",
)
# The calls are read in pages, each one short statement (see call_result_rows) of at most
# PAGE_ROWS calls and PAGE_BUDGET_BYTES of bodies, plus the body of the call that crosses it.
# Bounded by bytes, not by count: a stored body may be as large as RATEJOBS_MAX_RESPONSE_BYTES
# (1 MiB), and each download (a thread of the web server) holds a page a few times over (bytes,
# text, the encoded lines). Large enough that a statement's own cost (about a millisecond)
# stays a few percent of writing its page out: 2,000 small bodies, or 8 MiB of large ones.
PAGE_BUDGET_BYTES = 8 * 1024 * 1024
PAGE_ROWS = 2000
# The response is written in pieces of about this size: one syscall per few hundred rows,
# not one per row.
PIECE_BYTES = 256 * 1024


def call_result_rows(job: Job, statuses: Collection[str] = ()) -> Iterator[tuple[Any, ...]]:
    """The job's calls in index order as tuples of RESULT_FIELDS (times as ISO 8601 text), read
    a page at a time (_page), never all at once; only those with one of `statuses` if given."""
    # Keyset pages (index > the last one read, ORDER BY index LIMIT n), each a statement of its
    # own in autocommit: between pages the connection holds no transaction, no cursor and no
    # snapshot, however slowly the client reads. A cursor open for the whole file would leave
    # an "idle in transaction" session behind a slow client, holding VACUUM back until
    # idle_in_transaction_session_timeout cut the download. (job, index) is unique, so every
    # call comes once and in order, also while calls change meanwhile: each row is as it was
    # when its page was read.
    after, rows = -1, PAGE_ROWS
    while True:
        page = list(_page(job.pk, after, rows, statuses))
        kept = 0
        for *call, body, truncated, removed, key, query, before in page:
            if before >= PAGE_BUDGET_BYTES:
                break  # read without its body: the next page begins with it
            after, kept = call[0], kept + 1
            text, is_base64 = response_body_output(body, truncated=truncated)
            duration = call[_LEADING.index("duration")]
            yield (
                *call,
                text,
                is_base64,
                truncated,
                _moment(removed),
                key or job.credential_key,
                query,
                _milliseconds(duration),
            )
        else:
            if len(page) < rows:
                return
        del page  # else it is held while the next page is read: two pages instead of one
        # Twice the calls this page kept: large bodies fill a page with a few calls, and the
        # calls read past the budget (without their bodies) are read again by the next page.
        rows = min(PAGE_ROWS, 2 * kept)


def _page(job_id: int, after: int, rows: int, statuses: Collection[str] = ()) -> QuerySet:
    """Up to `rows` calls of the job after index `after`, as _COLUMNS and the bytes of the
    bodies before each in the page; a body only while those are under PAGE_BUDGET_BYTES."""
    # The sizes are the database's (length() of a stored value reads no body), so the bodies
    # past the budget are never read, and the page is one statement: one snapshot.
    before = Coalesce(
        Window(
            Sum(Coalesce(Length("response_body"), 0)),
            order_by="index",
            frame=RowRange(start=None, end=-1),
        ),
        0,
    )
    body = Case(When(before__lt=PAGE_BUDGET_BYTES, then=F("response_body")))
    columns = ["held_body" if name == "response_body" else name for name in _COLUMNS]
    calls = Call.objects.filter(job_id=job_id, index__gt=after)
    if statuses:
        calls = calls.filter(status__in=statuses)
    return (
        calls.order_by("index")
        .annotate(before=before, held_body=body)
        .values_list(*columns, "before")[:rows]
    )


def _moment(value: datetime | None) -> str | None:
    """As the REST API writes a time (DRF): ISO 8601, UTC as Z."""
    if value is None:
        return None
    text = value.isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _milliseconds(seconds: float | None) -> float | None:
    """Seconds as milliseconds to a tenth: a request's time is not measured finer than that,
    and 250.0 reads better than 0.25000000000000006 s."""
    return None if seconds is None else round(seconds * 1000, 1)


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
    """A header line of RESULT_FIELDS, then a line a call: empty for null, true/false, text that
    a spreadsheet would run as a formula behind a ' (see _csv_cell)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)

    def lines() -> Iterator[str]:
        yield ",".join(RESULT_FIELDS) + "\r\n"  # plain names: nothing to quote
        for row in rows:
            writer.writerow([_csv_cell(value) for value in row])
            yield buffer.getvalue()
            buffer.seek(0)
            buffer.truncate()

    return _pieces(lines())


# OWASP "CSV Injection": a spreadsheet runs a cell that starts with one of these as a formula
# (`=HYPERLINK(...)`, `+cmd|...`, `-2+3`, `@SUM(...)`; tab and CR are skipped by some before
# they read the rest). Bodies and errors come from third parties, paths and credential keys
# from submitters, so every text cell that starts so is written behind a `'`, which makes the
# spreadsheet show it as text. Only in CSV: JSON lines keep every value exactly.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Any) -> Any:
    """A row's value as its CSV cell: text made inert (FORMULA_STARTS), booleans as true/false,
    a query as its JSON text; numbers and None (an empty cell) as the csv module writes them."""
    # Exact classes: bool is an int, and the row holds only str, bool, int, float, None and the
    # query's dict (or list).
    if value.__class__ is str:
        return "'" + value if value.startswith(FORMULA_STARTS) else value
    if value.__class__ is bool:
        return "true" if value else "false"
    if value.__class__ in (dict, list):  # a call's query: its JSON text, as JSON lines give it
        return _csv_cell(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return value


@dataclass(frozen=True)
class ResultsFormat:
    name: str  # the file's extension, and what --format takes
    media_type: str
    write: Callable[[Iterable[tuple[Any, ...]]], Iterator[bytes]]


RESULTS_FORMATS = {
    "jsonl": ResultsFormat("jsonl", "application/x-ndjson", results_jsonl),
    "csv": ResultsFormat("csv", "text/csv; charset=utf-8", results_csv),
}


def job_results(job: Job, format: str, statuses: Collection[str] = ()) -> Iterator[bytes]:
    """The job's results file in `format` (a key of RESULTS_FORMATS), piece by piece; only the
    calls with one of `statuses` if given (export_results --status)."""
    return RESULTS_FORMATS[format].write(call_result_rows(job, statuses))


def job_results_response(job: Job, format: str) -> StreamingHttpResponse:
    """The download the REST API and the admin both serve: an attachment, streamed."""
    response = StreamingHttpResponse(
        job_results(job, format), content_type=RESULTS_FORMATS[format].media_type
    )
    response["Content-Disposition"] = f'attachment; filename="job-{job.pk}-results.{format}"'
    return response
