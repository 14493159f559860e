"""Reads on APIs and the live state of their shared limiters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.db.models import Exists, OuterRef, QuerySet
from django.http import Http404

from ratejobs.infra.connections import redis_client
from ratejobs.infra.limiters import api_limiter
from ratejobs.limiter import LimiterError, LimiterState, LimiterUnavailable
from ratejobs.limiter.buckets import KeyBuckets, key_buckets
from ratejobs.models import Api, ApiCredential
from ratejobs.namespace import limiter_key_prefix

if TYPE_CHECKING:
    from ratejobs.limiter.core import RateSample


@dataclass(frozen=True)
class LimiterReading:
    """An API's limiter state, or why it could not be read (exactly one is set)."""

    state: LimiterState | None
    error: str | None = None


def api_list() -> QuerySet[Api]:
    return Api.objects.order_by("name")


def api_get(*, name: str) -> Api:
    try:
        return api_list().get(name=name)
    except Api.DoesNotExist:
        raise Http404("no such API") from None


def api_limiter_state(api: Api) -> LimiterState:
    """The live state of the API's shared limiter; LimiterUnavailable when Redis is down."""
    return api_limiter(api).state()


def api_rate_history(api: Api, *, since: datetime) -> list[RateSample]:
    """The API's limiter samples since a moment, oldest first: its adaptive rate as grants were
    made (one sample per RATE_SAMPLE_SECONDS at most) and at each cut; [] when Redis cannot be
    read or the limiter has no history (nothing granted yet, or reset)."""
    try:
        return api_limiter(api).rate_history(since.timestamp())
    except LimiterError:  # LimiterUnavailable among them: a page with no chart, not an error
        return []


NOT_CONFIGURED_YET = LimiterReading(
    state=None,
    error="limiter not in Redis yet (never used, or idle past its lifetime): the workers "
    "configure it from the database at their next call",
)


def api_limiter_readings(apis: Iterable[Api]) -> dict[int, LimiterReading]:
    """Each API's limiter state by API id, never raising: a listing of APIs stays useful while
    Redis is down. After one LimiterUnavailable the rest are not tried (they share one Redis,
    and each try could wait out a connection timeout)."""
    readings: dict[int, LimiterReading] = {}
    unavailable: LimiterReading | None = None
    for api in apis:
        if unavailable is not None:
            readings[api.pk] = unavailable
            continue
        try:
            state = api_limiter_state(api)
        except LimiterUnavailable:
            unavailable = readings[api.pk] = LimiterReading(
                state=None, error="limiter state unavailable: Redis cannot be reached"
            )
        except LimiterError as exc:
            readings[api.pk] = LimiterReading(
                state=None, error=f"limiter state unavailable: {type(exc).__name__}"
            )
        else:
            # an API made while Redis was down (or whose keys were flushed) has no limiter yet:
            # its state is all zeros, no period to divide by
            readings[api.pk] = (
                LimiterReading(state=state) if state.configured else NOT_CONFIGURED_YET
            )
    return readings


def credential_list(*, api: Api, search: str = "") -> QuerySet[ApiCredential]:
    """The API's credentials (keys and when they were added; the secret column is deferred so
    a listing never loads one)."""
    credentials = ApiCredential.objects.filter(api=api).defer("credential_encrypted")
    if search:
        credentials = credentials.filter(key__contains=search)
    return credentials.order_by("key")


def api_key_buckets(api: Api, *, top: int = 10) -> KeyBuckets:
    """The API's credential keys with live limiter state in Redis (a bounded SCAN) and the most
    blocked or throttled of them; LimiterError when Redis cannot be read."""
    return key_buckets(redis_client(), api.name, top=top, key_prefix=limiter_key_prefix())


def api_list_marking_credentials() -> QuerySet[Api]:
    """api_list() with `has_credentials` on each API (in the same query)."""
    return api_list().annotate(
        has_credentials=Exists(ApiCredential.objects.filter(api=OuterRef("pk")))
    )
