"""A JSON parser that refuses request bodies over RATEJOBS_MAX_REQUEST_BYTES before parsing."""

from __future__ import annotations

import io
from typing import IO, Any

from django.conf import settings
from rest_framework.parsers import JSONParser

from ratejobs.api.errors import RequestTooLarge

# Bytes read from the request at a time while counting how large its body really is.
READ_CHUNK_BYTES = 1024 * 1024


def _too_large(limit: int) -> RequestTooLarge:
    return RequestTooLarge(f"Request body too large: the limit is {limit} bytes.")


class LimitedJSONParser(JSONParser):
    """JSON, at most settings.RATEJOBS_MAX_REQUEST_BYTES of it: a declared Content-Length over
    the limit is refused without reading anything, and a body that turns out larger than the
    limit (no or a wrong Content-Length) is refused as soon as the limit is passed."""

    def parse(
        self,
        stream: IO[bytes],
        media_type: str | None = None,
        parser_context: dict[str, Any] | None = None,
    ) -> Any:
        limit = settings.RATEJOBS_MAX_REQUEST_BYTES
        request = (parser_context or {}).get("request")
        meta = request.META if request is not None else {}
        try:
            declared = int(meta.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > limit:
            raise _too_large(limit)
        body = io.BytesIO()
        while chunk := stream.read(min(READ_CHUNK_BYTES, limit + 1 - body.tell())):
            body.write(chunk)
            if body.tell() > limit:
                raise _too_large(limit)
        body.seek(0)
        return super().parse(body, media_type, parser_context)
