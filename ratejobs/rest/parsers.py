"""Parsers of the REST API that bound what a request body costs: its bytes (413 past the
route's limit, before parsing) and the Python objects parsing builds from them.

None of them extends DRF's JSONParser: DRF hands a JSONParser `request.body`, which reads the
whole body into memory under Django's own DATA_UPLOAD_MAX_MEMORY_SIZE check (a 400 page, not
our 413). These read the request stream themselves, at most their limit plus one byte.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from typing import IO, Any, TypeVar

import ijson
from django.conf import settings
from rest_framework import serializers
from rest_framework.exceptions import ParseError, UnsupportedMediaType
from rest_framework.parsers import BaseParser
from rest_framework.request import Request

from ratejobs.json_limits import MAX_JSON_DEPTH, TOO_DEEP
from ratejobs.rest.errors import RequestTooLarge
from ratejobs.uploads import NumberedCalls, calls_from_jsonl

# Bytes read from the request at a time.
READ_CHUNK_BYTES = 1024 * 1024
# Parsed JSON costs 20 to 25 times its size in Python objects when it is all empty arrays or
# objects (72 bytes for the 3 of `[],`), so values are counted before anything is built.
# Bodies other than a job's calls are a handful of fields: this is plenty for them.
MAX_JSON_VALUES = 100_000
# Values a call may hold besides those of its JSON body (query parameters and headers).
CALL_VALUES_BESIDES_BODY = 10_000
# ijson's default backend (yajl, in C) refuses an integer over 64 bits, which JSON allows: a text
# holding one is read again by ijson's Python backend, exact but 16 times slower, only then.
_EXACT_IJSON = ijson.get_backend("python")
_T = TypeVar("_T")


def declared_length(request: Any) -> int | None:
    """The request's Content-Length, None when it has none (chunked) or a malformed one."""
    try:
        return int(request.META["CONTENT_LENGTH"])
    except (KeyError, ValueError, TypeError):
        return None


def is_chunked(request: Any) -> bool:
    """A body sent without Content-Length that the server hands over de-chunked up to its end
    (gunicorn says so with wsgi.input_terminated; Django's runserver does not, and gives such
    requests an empty body)."""
    return (
        declared_length(request) is None
        and "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()
        and bool(request.META.get("wsgi.input_terminated"))
    )


def too_large(limit: int, setting: str) -> RequestTooLarge:
    return RequestTooLarge(f"Request body too large: the limit is {limit} bytes ({setting}).")


class CappedReader(io.RawIOBase):
    """A body read through this raises RequestTooLarge as soon as more than `limit` bytes come,
    whatever Content-Length said (or with none)."""

    def __init__(self, stream: Any, limit: int, setting: str) -> None:
        self._stream, self._limit, self._setting = stream, limit, setting
        self._count = 0

    def readable(self) -> bool:
        return True

    def _counted(self, data: bytes) -> bytes:
        self._count += len(data)
        if self._count > self._limit:
            raise too_large(self._limit, self._setting)
        return data

    def _size(self, size: int | None) -> int:
        # Never more than one byte past the limit: enough to know it was passed.
        room = self._limit + 1 - self._count
        return room if size is None or size < 0 else min(size, room)

    def read(self, size: int | None = -1) -> bytes:
        size = self._size(size)
        return self._counted(self._stream.read(size)) if size > 0 else b""

    def readline(self, size: int | None = -1) -> bytes:
        size = self._size(size)
        return self._counted(self._stream.readline(size)) if size > 0 else b""

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def request_body_stream(request: Request, *, setting: str) -> IO[bytes]:
    """The body of a request as a stream capped at settings.<setting> bytes, for a view that
    reads it itself (a streamed upload): a declared Content-Length over the limit is refused
    at once, a chunked body when the limit is passed."""
    limit = getattr(settings, setting)
    declared = declared_length(request)
    if declared is not None and declared > limit:
        raise too_large(limit, setting)
    if declared is None and not is_chunked(request):
        return io.BytesIO(b"")
    # Django's request reads up to Content-Length; a chunked body is read from the server's
    # de-chunking stream to its end.
    source = request._request if declared is not None else request.META["wsgi.input"]
    return CappedReader(source, limit, setting)


def read_capped(stream: IO[bytes], parser_context: dict[str, Any] | None, setting: str) -> bytes:
    """The whole body, at most settings.<setting> bytes of it (else RequestTooLarge)."""
    limit = getattr(settings, setting)
    request = (parser_context or {}).get("request")
    declared = declared_length(request) if request is not None else None
    if declared is not None and declared > limit:
        raise too_large(limit, setting)
    body = bytearray()
    reader = CappedReader(stream, limit, setting)
    while chunk := reader.read(READ_CHUNK_BYTES):
        body += chunk
    return bytes(body)


def _events(body: bytes, backend: Any = ijson) -> Iterator[tuple[str, Any]]:
    """ijson's events of a JSON text (numbers with a fraction as floats, like json.loads)."""
    return backend.basic_parse(io.BytesIO(body), use_float=True)


def _parse_error(exc: Exception) -> ParseError:
    return ParseError(f"JSON parse error - {exc}")


def _with_exact_integers(parse: Callable[[Any], _T]) -> _T:
    """parse(an ijson backend): the default one, or the exact one where the default met an
    integer over 64 bits; ParseError for a text that is not JSON."""
    try:
        return parse(ijson)
    except ijson.JSONError as exc:
        if "integer overflow" not in str(exc):
            raise _parse_error(exc) from None
    try:
        return parse(_EXACT_IJSON)
    except ijson.JSONError as exc:
        raise _parse_error(exc) from None


def count_values(body: bytes, *, most: int) -> None:
    """Count the values of a JSON text without building them; ParseError when it is not JSON,
    nests deeper than MAX_JSON_DEPTH or holds more than `most` values."""
    _with_exact_integers(lambda backend: _count_values(_events(body, backend), most))


def _count_values(events: Iterator[tuple[str, Any]], most: int) -> None:
    depth = values = 0
    for event, _ in events:
        if event in ("end_map", "end_array"):
            depth -= 1
            continue
        values += 1
        if values > most:
            raise ParseError(f"Too many JSON values: at most {most}.")
        if event in ("start_map", "start_array"):
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise ParseError(f"{TOO_DEEP}.")


class LimitedJSONParser(BaseParser):
    """JSON of at most settings.RATEJOBS_MAX_REQUEST_BYTES, with at most MAX_JSON_VALUES values
    (counted before any is built)."""

    media_type = "application/json"
    limit_setting = "RATEJOBS_MAX_REQUEST_BYTES"

    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: dict[str, Any] | None = None,
    ) -> Any:
        body = read_capped(stream, parser_context, self.limit_setting)
        count_values(body, most=MAX_JSON_VALUES)
        try:
            return json.loads(body)
        except ValueError as exc:
            raise _parse_error(exc) from None


class JsonCalls:
    """The `calls` array of a job's JSON body, counted but not built: iterating parses it again
    from the body's bytes one call at a time, so the job service stores calls in batches
    without the whole list ever being Python objects."""

    def __init__(self, body: bytes, count: int, backend: Any = ijson) -> None:
        self._body, self._count, self._backend = body, count, backend

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Any]:
        return self._backend.items(io.BytesIO(self._body), "calls.item", use_float=True)


class JobJSONParser(LimitedJSONParser):
    """A new job as JSON: its fields built, its `calls` counted and checked in one pass over the
    events (more than RATEJOBS_MAX_CALLS_PER_REQUEST calls, or a call with more values than its
    body could hold, is refused before any call is built) and handed on as JsonCalls."""

    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: dict[str, Any] | None = None,
    ) -> Any:
        body = read_capped(stream, parser_context, self.limit_setting)
        return _with_exact_integers(lambda backend: _job_fields(body, backend))


def _job_fields(body: bytes, backend: Any) -> dict[str, Any]:
    events = _events(body, backend)
    event, _ = next(events, ("", None))
    if event != "start_map":
        raise ParseError("JSON parse error - expected an object.")
    fields: dict[str, Any] = {}
    budget = [MAX_JSON_VALUES]
    for event, key in events:
        if event == "end_map":
            break
        if key in fields:  # json.loads would keep the last; the calls stream would see both
            raise ParseError(f'JSON parse error - "{key}" given twice.')
        event, value = next(events)
        if key == "calls" and event == "start_array":
            fields[key] = JsonCalls(body, _count_calls(events), backend)
        else:
            fields[key] = _build(event, value, events, budget)
    for _ in events:  # ijson refuses anything after the object
        pass
    return fields


def _count_calls(events: Iterator[tuple[str, Any]]) -> int:
    """Walk a `calls` array (its start_array consumed) to its end: the number of calls."""
    most_calls = settings.RATEJOBS_MAX_CALLS_PER_REQUEST
    most_values = settings.RATEJOBS_MAX_CALL_BODY_BYTES // 2 + CALL_VALUES_BESIDES_BODY
    count = depth = values = 0
    for event, _ in events:
        if event in ("end_map", "end_array"):
            depth -= 1
            if depth < 0:
                return count
            continue
        if depth == 0:
            count += 1
            values = 0
            if count > most_calls:
                raise serializers.ValidationError(
                    {
                        "calls": [
                            f"More than {most_calls} calls: at most {most_calls} per job "
                            "(RATEJOBS_MAX_CALLS_PER_REQUEST); upload larger jobs as JSON "
                            "lines to /api/jobs/upload/."
                        ]
                    }
                )
        values += 1
        if values > most_values:
            # Every JSON value takes at least 2 bytes with its separator, so this call's body
            # cannot be within RATEJOBS_MAX_CALL_BODY_BYTES: refused without building it.
            raise serializers.ValidationError(
                {
                    "calls": {
                        str(count - 1): {
                            "non_field_errors": [
                                f"More than {most_values} JSON values in one call: its body "
                                "would be over RATEJOBS_MAX_CALL_BODY_BYTES "
                                f"({settings.RATEJOBS_MAX_CALL_BODY_BYTES} bytes)."
                            ]
                        }
                    }
                }
            )
        if event in ("start_map", "start_array"):
            depth += 1
            if depth > MAX_JSON_DEPTH:  # the call's own object is level 1
                raise ParseError(f"{TOO_DEEP}.")
    return count


def _build(event: str, value: Any, events: Iterator[tuple[str, Any]], budget: list[int]) -> Any:
    """The value starting with (event, value), built from the events that follow, taking at
    most budget[0] values (ParseError beyond)."""
    budget[0] -= 1
    if event not in ("start_map", "start_array"):
        return value
    root: dict | list = {} if event == "start_map" else []
    stack: list[dict | list] = [root]
    key: Any = None
    for event, value in events:
        if event == "map_key":
            key = value
            continue
        if event in ("end_map", "end_array"):
            stack.pop()
            if not stack:
                return root
            continue
        budget[0] -= 1
        if budget[0] < 0:
            raise ParseError(f"Too many JSON values: at most {MAX_JSON_VALUES}.")
        if len(stack) >= MAX_JSON_DEPTH:
            raise ParseError(f"{TOO_DEEP}.")
        item = {} if event == "start_map" else [] if event == "start_array" else value
        parent = stack[-1]
        if isinstance(parent, dict):
            parent[key] = item
        else:
            parent.append(item)
        if event in ("start_map", "start_array"):
            stack.append(item)
    return root


class JsonLinesParser(BaseParser):
    """Calls as JSON lines (one object a line), read from the request one line at a time: the
    result is a NumberedCalls stream, consumed once by the job service."""

    media_type = "application/x-ndjson"
    limit_setting = "RATEJOBS_MAX_UPLOAD_BYTES"

    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: dict[str, Any] | None = None,
    ) -> NumberedCalls:
        limit = getattr(settings, self.limit_setting)
        return calls_from_jsonl(CappedReader(stream, limit, self.limit_setting))


def upload_calls(request: Request) -> NumberedCalls:
    """The calls of a JSON lines upload, streamed from the request whether it came with a
    Content-Length or chunked (DRF's request.data sees no body without a Content-Length).
    No body at all is no calls, whatever its Content-Type (the service's 400, not a 415)."""
    if not declared_length(request) and not is_chunked(request):
        return calls_from_jsonl(io.BytesIO(b""))
    parser = request.negotiator.select_parser(request, request.parsers)
    if not isinstance(parser, JsonLinesParser):
        raise UnsupportedMediaType(request.content_type)
    return calls_from_jsonl(request_body_stream(request, setting=parser.limit_setting))
