"""A file of calls kept between tries of the admin's submit page: a browser empties its file
input when the form comes back with errors, so the page keeps the file for the next try.

One file per user (a new one replaces it), in the database, which every web process shares,
and not in the Redis that holds the limiter and the broker, whose memory a user refused again
and again could otherwise fill. Files are kept for an hour, up to a size each and a total for
everyone; the retention task removes expired ones (and every keep does, before counting).
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import IO, Any

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.template.defaultfilters import filesizeformat
from django.utils import timezone

from ratejobs.models import KeptUpload

# Long enough to fix the form, short enough that files do not pile up.
KEPT_UPLOAD_SECONDS = 60 * 60
# The random token the form carries names the file of one try: the next one replaces it.
TOKEN_BYTES = 16


class UploadNotKept(Exception):
    """A file could not be kept for the next try; the message says why, for its sender."""


def upload_keep(*, user: Any, name: str, stream: IO[bytes], size: int) -> KeptUpload:
    """Keep a file for the user's next try, in place of the one kept before; UploadNotKept
    when it is over RATEJOBS_KEPT_UPLOAD_MAX_BYTES or the files kept for everyone would pass
    RATEJOBS_KEPT_UPLOADS_MAX_TOTAL_BYTES."""
    most = settings.RATEJOBS_KEPT_UPLOAD_MAX_BYTES
    too_large = UploadNotKept(
        f"{name} ({filesizeformat(size)}) is larger than {filesizeformat(most)} and is not kept "
        "between tries: choose it again."
    )
    if size > most:
        raise too_large
    stream.seek(0)
    content = stream.read(most + 1)
    if len(content) > most:
        raise too_large
    now = timezone.now()
    with transaction.atomic():
        kept_uploads_remove_expired(now=now)
        # Two users keeping at once may both pass this check: the total can go over by what
        # concurrent submits carry, never by more.
        others = KeptUpload.objects.exclude(user=user).aggregate(total=Sum("size"))["total"]
        if (others or 0) + len(content) > settings.RATEJOBS_KEPT_UPLOADS_MAX_TOTAL_BYTES:
            raise UploadNotKept(
                f"{name} is not kept between tries: the space for kept files is full for now. "
                "Choose it again."
            )
        kept, _ = KeptUpload.objects.update_or_create(
            user=user,
            defaults={
                "token": secrets.token_urlsafe(TOKEN_BYTES),
                "name": name[: KeptUpload._meta.get_field("name").max_length],
                "content": content,
                "size": len(content),
                "kept_until": now + timedelta(seconds=KEPT_UPLOAD_SECONDS),
            },
        )
    return kept


def upload_kept(*, user: Any, token: str) -> KeptUpload | None:
    """The file the user's last try kept under this token; None once expired or replaced, or
    when the token is another user's or not one at all. Kept an hour more from now."""
    if not token or len(token) > KeptUpload._meta.get_field("token").max_length:
        return None
    now = timezone.now()
    kept = KeptUpload.objects.filter(user=user, token=token, kept_until__gt=now).first()
    if kept is not None:
        kept.kept_until = now + timedelta(seconds=KEPT_UPLOAD_SECONDS)
        kept.save(update_fields=["kept_until"])
        kept.content = bytes(kept.content)  # a memoryview on PostgreSQL
    return kept


def upload_forget(*, user: Any, token: str) -> None:
    if token:
        KeptUpload.objects.filter(user=user, token=token).delete()


def kept_uploads_remove_expired(*, now: Any = None) -> int:
    """Remove files kept past their hour; how many were removed."""
    removed, _ = KeptUpload.objects.filter(kept_until__lte=now or timezone.now()).delete()
    return removed
