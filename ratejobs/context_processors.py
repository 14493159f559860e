"""Template context for the admin's header: links to the tools operators use beside it."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def operations_links(request: HttpRequest) -> dict[str, str]:
    return {"flower_url": settings.RATEJOBS_FLOWER_URL}
