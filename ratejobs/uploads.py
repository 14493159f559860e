"""Files of calls uploaded by people (CSV, JSONL) or a path template with values, read as a
stream of call specs, and submitted as a job with every bad line of them named. Only the format
is checked while reading; the calls themselves are validated by the job service, which stores
them in batches, so a large file is never held whole in memory.
"""

from __future__ import annotations

import csv
import io
import re
import string
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import parse_qsl, quote

from django.core.exceptions import NON_FIELD_ERRORS, ValidationError
from django.db import transaction

from ratejobs.json_limits import JsonTooDeep, loads_bounded
from ratejobs.models import Api, Job
from ratejobs.services.jobs import CallsInvalid, call_fields_from_spec, job_submit

# One line or row of a file may be this long: a file without newlines cannot force itself
# into memory whole. A call's body is capped at 1 MiB, so 4 MiB leaves room for JSON escaping.
MAX_LINE_BYTES = 4 * 1024 * 1024
# The columns of a CSV file (the fields of a JSONL line), and what each holds, as the submit
# page explains them.
CALL_COLUMNS = (
    ("method", "GET when empty; or HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
    ("path", "required: the path under the API's base URL, such as /users/42"),
    ("query", 'the query string, a=1&b=2 (CSV only), or a JSON object such as {"a": 1}'),
    ("headers", 'a JSON object of header names to values, such as {"X-Trace": "t1"}'),
    ("json", "a JSON body, sent as application/json"),
    ("body", "a text body, sent as it is (instead of json)"),
    ("cost", "the call's estimated cost in the API's cost windows (tokens), a whole number; "
     "0 when empty"),
    ("credential_key", "send the call with this customer's credential of the API; the job's "
     "when empty"),
)  # fmt: skip
CSV_COLUMNS = tuple(name for name, _ in CALL_COLUMNS)
JSON_COLUMNS = ("headers", "json")
# A reply names this many errors, in line order, and counts the rest: enough to fix a
# systematic mistake, short enough to read.
MAX_ERRORS_SHOWN = 20
# Once a file has an error, of any kind, at most this many more lines are read (about 2 s of
# reading and checking), only to count their errors; then the count becomes "at least N". The
# job service stops checking calls after 20 bad ones, and a file of a million unreadable lines
# costs no more to refuse than one of a hundred thousand.
MAX_LINES_READ_AFTER_AN_ERROR = 100_000

csv.field_size_limit(MAX_LINE_BYTES)  # process-wide in the csv module; no per-reader limit


class UploadError(ValueError):
    """The file cannot be read as calls; `line` is the 1-based line it failed on, if any."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line
        self.reason = message  # without the line, for replies that name the line apart
        # as UploadErrors has them: the errors shown, how many there are, whether all counted
        self.errors = [LineError(line, NON_FIELD_ERRORS, message)]
        self.total, self.exact = 1, True

    def messages(self) -> list[str]:
        """What to show, one message a line."""
        return [str(self)]


@dataclass(frozen=True)
class LineError:
    """One error of a file: its line, the call's field it is about (NON_FIELD_ERRORS for the
    line as a whole) and the message."""

    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line is not None else ""
        field = "" if self.field == NON_FIELD_ERRORS else f"{self.field}: "
        return f"{where}{field}{self.message}"


class UploadErrors(UploadError):
    """Every error of a file, the first MAX_ERRORS_SHOWN of them by line; `total` counts them
    all when `exact`, else at least that many (the file was too long to read to its end)."""

    def __init__(self, errors: list[LineError], total: int, exact: bool) -> None:
        super().__init__(errors[0].message, errors[0].line)
        self.errors, self.total, self.exact = errors, total, exact
        self.args = ("; ".join(self.messages()),)

    def messages(self) -> list[str]:
        """One message per error shown, then "and 12 more errors" when some are not."""
        more = self.total - len(self.errors)
        shown = [str(error) for error in self.errors]
        if not more:
            return shown
        count = f"{more:,}" if self.exact else f"at least {more:,}"
        return [*shown, f"and {count} more error{'s' if more != 1 else ''}"]


class _ErrorsInLineOrder:
    """Errors arriving in line order, keeping the first MAX_ERRORS_SHOWN and counting all."""

    def __init__(self) -> None:
        self.first: list[LineError] = []
        self.count = 0

    def add(self, error: LineError) -> None:
        self.count += 1
        if len(self.first) < MAX_ERRORS_SHOWN:
            self.first.append(error)


class NumberedCalls:
    """The calls read from a file or a list of values, remembering the line each came from, so
    that an error the job service reports for call N can name the line a person can find.

    A line that cannot be read as a call is skipped and its error kept; at the end of the file
    they are raised together (UploadErrors), unless the calls are submitted with
    job_submit_from_file(), which also names the calls the job service refuses."""

    def __init__(self, numbered: Iterator[tuple[int, dict | UploadError]]) -> None:
        self._numbered = numbered
        self._lines = array("L")  # 4 or 8 bytes a call: a million calls cost a few MiB
        self._unreadable = _ErrorsInLineOrder()  # lines that are no call
        self._refused = _ErrorsInLineOrder()  # calls the job service refused
        self._ended = False  # the file was read to its end
        self._read_after_an_error = 0
        self._raise_at_end = True

    def __iter__(self) -> NumberedCalls:
        return self

    def __next__(self) -> dict:
        while not self._out_of_budget():
            try:
                line, spec = next(self._numbered)
            except StopIteration:
                self._ended = True
                break
            if self.has_errors():
                self._read_after_an_error += 1
            if isinstance(spec, UploadError):
                self._unreadable.add(LineError(spec.line, NON_FIELD_ERRORS, spec.reason))
                continue
            self._lines.append(line)
            return spec
        if self._raise_at_end and self.has_errors():
            raise self.errors()
        raise StopIteration

    def _out_of_budget(self) -> bool:
        return self._read_after_an_error >= MAX_LINES_READ_AFTER_AN_ERROR

    def line_of(self, index: int) -> int | None:
        return self._lines[index] if 0 <= index < len(self._lines) else None

    def has_errors(self) -> bool:
        return bool(self._unreadable.count or self._refused.count)

    def errors(self) -> UploadErrors:
        """The errors found so far, the first of them by line, with their count."""
        first = sorted(
            self._unreadable.first + self._refused.first,
            key=lambda error: error.line if error.line is not None else 0,
        )[:MAX_ERRORS_SHOWN]
        total = self._unreadable.count + self._refused.count
        return UploadErrors(first, total, exact=self._ended)

    def _add_refused(self, invalid: CallsInvalid) -> None:
        for index, fields in invalid.call_errors.items():
            self._add_refused_call(index, fields)

    def _add_refused_call(self, index: int, fields: dict[str, list[str]]) -> None:
        for field, messages in fields.items():
            for message in messages:
                self._refused.add(LineError(self.line_of(index), field, message))

    def _count_the_rest(self, api: Api) -> None:
        """After the job service stopped at its 20th bad call, check the calls after it only to
        count their errors, up to MAX_LINES_READ_AFTER_AN_ERROR lines."""
        start = len(self._lines)
        for offset, spec in enumerate(self):
            try:
                call_fields_from_spec(api=api, spec=spec)
            except ValidationError as exc:
                fields = (
                    exc.message_dict
                    if hasattr(exc, "error_dict")
                    else {NON_FIELD_ERRORS: exc.messages}
                )
                self._add_refused_call(start + offset, fields)


class _LinesRefused(Exception):
    """Rolls back a job whose good calls were stored while bad lines were skipped."""


def job_submit_from_file(*, calls: NumberedCalls, api: Api, **fields: Any) -> tuple[Job, bool]:
    """job_submit() for calls read from a file or a list of values: the job with all its calls,
    or nothing stored and UploadErrors naming every bad line (unreadable, or a call the job
    service refuses), the first MAX_ERRORS_SHOWN by line, with their count."""
    calls._raise_at_end = False  # the errors are raised here, with the service's
    try:
        with transaction.atomic():
            job, created = job_submit(calls=calls, api=api, **fields)
            if calls.has_errors():
                raise _LinesRefused
    except CallsInvalid as exc:
        calls._add_refused(exc)
    except _LinesRefused:
        pass
    except ValidationError:
        # "no call at all" or "too many calls": the bad lines come first, if there are any
        if not calls.has_errors():
            raise
    else:
        return job, created
    calls._count_the_rest(api)
    raise calls.errors() from None


def calls_from_jsonl(stream: IO[bytes]) -> NumberedCalls:
    """One JSON object per line; blank lines are skipped."""
    return NumberedCalls(_numbered_jsonl(stream))


def _numbered_jsonl(stream: IO[bytes]) -> Iterator[tuple[int, dict | UploadError]]:
    line_number = 0
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        line_number += 1
        if len(raw) > MAX_LINE_BYTES:
            yield line_number, UploadError(f"longer than {MAX_LINE_BYTES} bytes", line_number)
            while raw and not raw.endswith(b"\n"):  # skip the rest of it, a bounded read each
                raw = stream.readline(MAX_LINE_BYTES + 1)
            continue
        if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            yield line_number, UploadError("not UTF-8 text", line_number)
            continue
        if not text.strip():
            continue
        try:
            spec = loads_bounded(text)
        except JsonTooDeep as exc:
            yield line_number, UploadError(str(exc), line_number)
            continue
        except ValueError as exc:
            yield line_number, UploadError(f"not valid JSON: {exc}", line_number)
            continue
        if not isinstance(spec, dict):
            yield line_number, UploadError("each line must be a JSON object (a call)", line_number)
            continue
        yield line_number, spec


def calls_from_csv(stream: IO[bytes]) -> NumberedCalls:
    """A header row naming columns among CSV_COLUMNS, then one call per row. Query, headers
    and json cells hold JSON; a query may also be written as `a=1&b=2`."""
    return NumberedCalls(_numbered_csv(stream))


def _numbered_csv(stream: IO[bytes]) -> Iterator[tuple[int, dict | UploadError]]:
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
    reader = csv.reader(text)
    try:
        header = next(reader, None)
        if header is None:
            yield 1, UploadError("the file is empty: a header row is needed", 1)
            return
        columns = [name.strip().lower() for name in header]
        unknown = [name for name in columns if name not in CSV_COLUMNS]
        if unknown:
            message = f"unknown columns: {', '.join(unknown)} (use {', '.join(CSV_COLUMNS)})"
            yield 1, UploadError(message, 1)
            return
        if "path" not in columns:
            yield 1, UploadError("a path column is needed", 1)
            return
        line_number = reader.line_num
        for row in reader:
            first_line = line_number + 1
            line_number = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) > len(columns):
                yield first_line, UploadError(f"{len(row)} cells for {len(columns)} columns",
                                              first_line)  # fmt: skip
                continue
            try:
                yield first_line, _csv_call(dict(zip(columns, row, strict=False)), first_line)
            except UploadError as exc:
                yield first_line, exc
    # Past a broken quote or undecodable bytes the rows cannot be told apart: the file's
    # reading ends there, with the errors found before.
    except UnicodeDecodeError:
        yield reader.line_num + 1, UploadError("not UTF-8 text", reader.line_num + 1)
    except csv.Error as exc:
        yield reader.line_num, UploadError(f"not valid CSV: {exc}", reader.line_num)
    finally:
        text.detach()  # leave the upload open for its owner


def _csv_call(cells: dict[str, str], line: int) -> dict:
    spec: dict[str, Any] = {}
    for name, cell in cells.items():
        if not cell.strip():
            continue
        if name in ("method", "path", "credential_key"):
            spec[name] = cell.strip()
        elif name == "cost":  # a whole number; anything else is left for the service to name
            text = cell.strip()
            spec[name] = int(text) if text.isascii() and text.isdigit() else text
        elif name == "body":
            spec[name] = cell
        elif name == "query" and not cell.lstrip().startswith("{"):
            spec[name] = _query_from_string(cell.strip())
        else:
            try:
                spec[name] = loads_bounded(cell, outer_levels=1)  # the call holds the cell
            except JsonTooDeep as exc:
                raise UploadError(f"column {name}: {exc}", line) from None
            except ValueError as exc:
                raise UploadError(f"column {name}: not valid JSON: {exc}", line) from None
    return spec


def _query_from_string(query: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in parse_qsl(query.lstrip("?"), keep_blank_values=True):
        if name in values:
            previous = values[name]
            values[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            values[name] = value
    return values


_PLACEHOLDER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def calls_from_template(
    *, method: str, path_template: str, values: Iterable[str], cost: int = 0
) -> NumberedCalls:
    """`/users/{id}` and one value per line: one call per value, each of estimated `cost`. A
    value fills the single placeholder quoted, so it can neither add path segments nor a
    query."""
    names = (
        {field for _, field, _, _ in string.Formatter().parse(path_template) if field is not None}
        if _braces_balanced(path_template)
        else None
    )
    if names is None or len(names) != 1 or not _PLACEHOLDER.match(next(iter(names))):
        raise UploadError(
            "the path template needs exactly one placeholder such as {id}, e.g. /users/{id}"
        )
    (name,) = names
    return NumberedCalls(_numbered_template_calls(method, path_template, name, values, cost))


def _numbered_template_calls(
    method: str, path_template: str, name: str, values: Iterable[str], cost: int
) -> Iterator[tuple[int, dict | UploadError]]:
    for line_number, value in enumerate(values, start=1):
        value = value.strip()
        if not value:
            continue
        if len(value) > MAX_LINE_BYTES:
            yield line_number, UploadError(f"longer than {MAX_LINE_BYTES} bytes", line_number)
            continue
        yield (
            line_number,
            {
                "method": method,
                "path": path_template.replace("{" + name + "}", quote(value, safe="")),
                **({"cost": cost} if cost else {}),
            },
        )


def _braces_balanced(template: str) -> bool:
    try:
        list(string.Formatter().parse(template))
    except ValueError:
        return False
    return True


def calls_from_upload(name: str, stream: IO[bytes]) -> NumberedCalls:
    """Pick the reader from the file's extension."""
    lowered = name.lower()
    if lowered.endswith((".jsonl", ".ndjson")):
        return calls_from_jsonl(stream)
    if lowered.endswith(".csv"):
        return calls_from_csv(stream)
    raise UploadError("unsupported file type: use .csv or .jsonl")
