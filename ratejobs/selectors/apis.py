"""Reads on APIs and the live state of their shared limiters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import QuerySet
from django.http import Http404

from ratejobs.limiter import LimiterError, LimiterState, LimiterUnavailable
from ratejobs.models import Api
from ratejobs.services.apis import api_limiter


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
            readings[api.pk] = LimiterReading(state=api_limiter_state(api))
        except LimiterUnavailable:
            unavailable = readings[api.pk] = LimiterReading(
                state=None, error="limiter state unavailable: Redis cannot be reached"
            )
        except LimiterError as exc:
            readings[api.pk] = LimiterReading(
                state=None, error=f"limiter state unavailable: {type(exc).__name__}"
            )
    return readings
