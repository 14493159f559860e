"""Request size for every REST route, before anything reads the body: 413 when a declared
Content-Length is over the route's limit, and a chunked body (no Content-Length) read up to
the limit so that DRF, which ignores a body without a length, parses it like any other."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework.views import APIView

from ratejobs.rest.errors import RequestTooLarge
from ratejobs.rest.parsers import CappedReader, declared_length, is_chunked, too_large

# A chunked body is kept in memory up to this size and in a temporary file beyond it.
SPOOL_MEMORY_BYTES = 1024 * 1024
COPY_CHUNK_BYTES = 64 * 1024


def body_limit_setting(view_class: type) -> str:
    """The setting naming the route's body limit: a view may name its own (the streamed upload
    does), every other REST route has RATEJOBS_MAX_REQUEST_BYTES."""
    return getattr(view_class, "body_limit_setting", "RATEJOBS_MAX_REQUEST_BYTES")


class RequestSizeMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_view(
        self, request: HttpRequest, view_func: Any, view_args: Any, view_kwargs: Any
    ) -> HttpResponse | None:
        view_class = getattr(view_func, "view_class", None)
        if not (isinstance(view_class, type) and issubclass(view_class, APIView)):
            return None
        setting = body_limit_setting(view_class)
        limit = getattr(settings, setting)
        declared = declared_length(request)
        if declared is not None and declared > limit:
            return _refusal(too_large(limit, setting))
        if declared is None and _says_chunked(request) and not is_chunked(request):
            # Django's development server hands the app no chunked body: say so, rather than
            # let the request look empty.
            return JsonResponse(
                {"detail": "This server cannot read a chunked body: send a Content-Length."},
                status=411,
            )
        if is_chunked(request) and not getattr(view_class, "streams_body", False):
            try:
                _spool_chunked_body(request, limit, setting)
            except RequestTooLarge as exc:
                return _refusal(exc)
        return None


def _says_chunked(request: HttpRequest) -> bool:
    return "chunked" in request.META.get("HTTP_TRANSFER_ENCODING", "").lower()


def _spool_chunked_body(request: HttpRequest, limit: int, setting: str) -> None:
    """Read the chunked body (at most `limit` bytes) and give the request its real length."""
    spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115
    source = CappedReader(request.META["wsgi.input"], limit, setting)
    while chunk := source.read(COPY_CHUNK_BYTES):
        spool.write(chunk)
    size = spool.tell()
    spool.seek(0)
    request._stream = LimitedStream(spool, size)
    request.META["CONTENT_LENGTH"] = str(size)


def _refusal(exc: RequestTooLarge) -> JsonResponse:
    return JsonResponse({"detail": str(exc.detail)}, status=exc.status_code)
