"""Files of calls uploaded by people (CSV, JSONL) or a path template with values, read as a
stream of call specs. Only the format is checked here; the calls themselves are validated by
the job service, which stores them in batches, so a large file is never held whole in memory.
"""

from __future__ import annotations

import csv
import io
import json
import re
import string
from array import array
from collections.abc import Iterable, Iterator
from typing import IO, Any
from urllib.parse import parse_qsl, quote

from ratejobs.services.jobs import CallsInvalid

# One line or row of a file may be this long: a file without newlines cannot force itself
# into memory whole. A call's body is capped at 1 MiB, so 4 MiB leaves room for JSON escaping.
MAX_LINE_BYTES = 4 * 1024 * 1024
CSV_COLUMNS = ("method", "path", "query", "headers", "json", "body", "cost", "credential_key")
JSON_COLUMNS = ("headers", "json")

csv.field_size_limit(MAX_LINE_BYTES)  # process-wide in the csv module; no per-reader limit


class UploadError(ValueError):
    """The file cannot be read as calls; `line` is the 1-based line it failed on, if any."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line
        self.reason = message  # without the line, for replies that name the line apart


class NumberedCalls:
    """The calls read from a file or a list of values, remembering the line each came from, so
    that an error the job service reports for call N can name the line a person can find."""

    def __init__(self, numbered: Iterator[tuple[int, dict]]) -> None:
        self._numbered = numbered
        self._lines = array("L")  # 4 or 8 bytes a call: a million calls cost a few MiB

    def __iter__(self) -> NumberedCalls:
        return self

    def __next__(self) -> dict:
        line, spec = next(self._numbered)
        self._lines.append(line)
        return spec

    def line_of(self, index: int) -> int | None:
        return self._lines[index] if 0 <= index < len(self._lines) else None

    def error_messages(self, invalid: CallsInvalid) -> list[str]:
        """The job service's errors by call index, as messages by line."""
        return invalid.messages_by(lambda index: f"line {self.line_of(index)}")


def calls_from_jsonl(stream: IO[bytes]) -> NumberedCalls:
    """One JSON object per line; blank lines are skipped."""
    return NumberedCalls(_numbered_jsonl(stream))


def _numbered_jsonl(stream: IO[bytes]) -> Iterator[tuple[int, dict]]:
    line_number = 0
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        line_number += 1
        if len(raw) > MAX_LINE_BYTES:
            raise UploadError(f"longer than {MAX_LINE_BYTES} bytes", line_number)
        if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise UploadError("not UTF-8 text", line_number) from None
        if not text.strip():
            continue
        try:
            spec = json.loads(text)
        except ValueError as exc:
            raise UploadError(f"not valid JSON: {exc}", line_number) from None
        if not isinstance(spec, dict):
            raise UploadError("each line must be a JSON object (a call)", line_number)
        yield line_number, spec


def calls_from_csv(stream: IO[bytes]) -> NumberedCalls:
    """A header row naming columns among CSV_COLUMNS, then one call per row. Query, headers
    and json cells hold JSON; a query may also be written as `a=1&b=2`."""
    return NumberedCalls(_numbered_csv(stream))


def _numbered_csv(stream: IO[bytes]) -> Iterator[tuple[int, dict]]:
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
    reader = csv.reader(text)
    try:
        header = next(reader, None)
        if header is None:
            raise UploadError("the file is empty: a header row is needed", 1)
        columns = [name.strip().lower() for name in header]
        unknown = [name for name in columns if name not in CSV_COLUMNS]
        if unknown:
            raise UploadError(
                f"unknown columns: {', '.join(unknown)} (use {', '.join(CSV_COLUMNS)})", 1
            )
        if "path" not in columns:
            raise UploadError("a path column is needed", 1)
        line_number = reader.line_num
        for row in reader:
            first_line = line_number + 1
            line_number = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            if len(row) > len(columns):
                raise UploadError(f"{len(row)} cells for {len(columns)} columns", first_line)
            yield first_line, _csv_call(dict(zip(columns, row, strict=False)), first_line)
    except UnicodeDecodeError:
        raise UploadError("not UTF-8 text", reader.line_num + 1) from None
    except csv.Error as exc:
        raise UploadError(f"not valid CSV: {exc}", reader.line_num) from None
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
                spec[name] = json.loads(cell)
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
) -> Iterator[tuple[int, dict]]:
    for line_number, value in enumerate(values, start=1):
        value = value.strip()
        if not value:
            continue
        if len(value) > MAX_LINE_BYTES:
            raise UploadError(f"longer than {MAX_LINE_BYTES} bytes", line_number)
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
