"""Prometheus metrics at /metrics: per API the shared limiter's counts and live state (read
from Redis, so they sum every worker on every machine), and calls and jobs by status (from the
database).

Labels stay bounded: an API's name and a status, never a job or call id. The limiter's counts
start again from zero when its state is reset (a counter reset, which Prometheus handles).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from ratejobs.limiter import LimiterError, LimiterState
from ratejobs.selectors.apis import (
    api_key_buckets,
    api_limiter_readings,
    api_list_marking_credentials,
)
from ratejobs.selectors.jobs import call_counts_by_api, job_counts_by_status

if TYPE_CHECKING:
    from ratejobs.limiter.core import WindowState

# Per API, from its limiter state: (type, name, help, value). Rates are per second whatever
# the API's period, so that dashboards can compare APIs.
LIMITER_METRICS: list[tuple[type, str, str, Callable[[LimiterState], float]]] = [
    (CounterMetricFamily, "ratejobs_limiter_grants", "requests the limiter let through",
     lambda s: s.counts.grants),
    (CounterMetricFamily, "ratejobs_limiter_wait_seconds", "total time to reserved slots",
     lambda s: s.counts.wait_seconds),
    (CounterMetricFamily, "ratejobs_throttled_responses", "429s (and hinted 403s) received",
     lambda s: s.counts.throttles),
    (CounterMetricFamily, "ratejobs_limiter_blocks",
     "blocks of every worker (Retry-After, spent quota, manual)", lambda s: s.counts.blocks),
    (CounterMetricFamily, "ratejobs_limiter_rate_decreases", "adaptive rate cuts",
     lambda s: s.counts.decreases),
    (GaugeMetricFamily, "ratejobs_limiter_rate", "current rate, requests per second",
     lambda s: s.current_rate / s.period),
    (GaugeMetricFamily, "ratejobs_limiter_rate_ceiling", "configured rate, requests per second",
     lambda s: s.rate / s.period),
    (GaugeMetricFamily, "ratejobs_limiter_learned_rate",
     "the API's real limit as the adaptive rate learned it, requests per second (0 until "
     "measured)", lambda s: (s.learned_rate or 0.0) / s.period),
    (GaugeMetricFamily, "ratejobs_limiter_blocked_seconds",
     "seconds until every worker may send again", lambda s: s.blocked_for),
    (GaugeMetricFamily, "ratejobs_limiter_in_flight", "requests in flight across workers",
     lambda s: s.in_flight),
    (GaugeMetricFamily, "ratejobs_limiter_max_concurrency", "in-flight cap, 0 for none",
     lambda s: s.max_concurrency),
]  # fmt: skip

# Per window of an API's limits (besides its main rate), labelled with Window.label ("300/60s",
# "90000 cost/60s"): units, in the window's own unit (requests or cost).
WINDOW_METRICS: list[tuple[str, str, Callable[[WindowState], float]]] = [
    ("ratejobs_limiter_window_remaining", "units of the window that may go now",
     lambda w: w.remaining),
    ("ratejobs_limiter_window_full_seconds",
     "seconds until the window's whole burst is back (its quota refilled)", lambda w: w.full_in),
    ("ratejobs_limiter_window_burst", "units the window holds when full", lambda w: w.window.burst),
]  # fmt: skip

# Why a request for a slot was not granted at once, and the count that says how often.
WAIT_REASONS = {
    "slot": "waits",  # a later slot was reserved, and slept for or retried at
    "too_long": "too_long",  # the next slot was further away than a worker waits
    "at_capacity": "at_capacity",  # max_concurrency requests were already in flight
}


class RatejobsCollector(Collector):
    """Reads everything at scrape time: one Redis script per API and three small queries."""

    def collect(self) -> Iterator[Metric]:
        apis = list(api_list_marking_credentials())
        readings = api_limiter_readings(apis)
        up = GaugeMetricFamily(
            "ratejobs_limiter_up", "1 when the limiter state was read from Redis", labels=["api"]
        )
        families = [(kind(name, doc, labels=["api"]), value) for kind, name, doc, value in
                    LIMITER_METRICS]  # fmt: skip
        windows = [(GaugeMetricFamily(name, doc, labels=["api", "window"]), value)
                   for name, doc, value in WINDOW_METRICS]  # fmt: skip
        waits = CounterMetricFamily(
            "ratejobs_limiter_waits", "slot requests not granted at once, by reason",
            labels=["api", "reason"],
        )  # fmt: skip
        for api in apis:
            state = readings[api.pk].state
            readable = state is not None and state.configured
            up.add_metric([api.name], 1 if readable else 0)
            if not readable:
                continue
            for family, value in families:
                family.add_metric([api.name], value(state))
            for reason, field in WAIT_REASONS.items():
                waits.add_metric([api.name, reason], getattr(state.counts, field))
            for window in state.windows:
                for family, value in windows:
                    family.add_metric([api.name, window.window.label], value(window))
        yield up
        yield from (family for family, _ in families)
        yield from (family for family, _ in windows)
        yield waits
        yield self._key_buckets([api for api in apis if readings[api.pk].state is not None])
        yield self._calls({api.pk: api.name for api in apis})
        jobs = GaugeMetricFamily("ratejobs_jobs", "jobs by status", labels=["status"])
        for status, count in job_counts_by_status().items():
            jobs.add_metric([status], count)
        yield jobs

    @staticmethod
    def _key_buckets(apis: list) -> Metric:
        """Credential keys with a live bucket, per API (one gauge per API, never a label per
        key); only for APIs with credentials, each a bounded SCAN of Redis."""
        family = GaugeMetricFamily(
            "ratejobs_limiter_key_buckets",
            "credential keys with a live limiter bucket (bounded count)",
            labels=["api"],
        )
        for api in apis:
            if api.has_credentials:
                try:
                    family.add_metric([api.name], api_key_buckets(api, top=0).live)
                except LimiterError:
                    continue  # ratejobs_limiter_up says Redis is not answering
        return family

    @staticmethod
    def _calls(names: dict[int, str]) -> Metric:
        calls = GaugeMetricFamily(
            "ratejobs_calls", "calls by API and status", labels=["api", "status"]
        )
        for api_id, by_status in sorted(call_counts_by_api().items()):
            for status, count in by_status.items():
                calls.add_metric([names[api_id], status], count)
        return calls


def build_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RatejobsCollector())
    # The web process's own health, as every Python exporter shows it.
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


REGISTRY = build_registry()


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus text format, for a scraper that sends RATEJOBS_METRICS_TOKEN as a bearer
    token; for anyone only when RATEJOBS_METRICS_PUBLIC says so (fails closed)."""
    token = settings.RATEJOBS_METRICS_TOKEN
    if token:
        sent = request.headers.get("Authorization", "").removeprefix("Bearer ")
        if not hmac.compare_digest(sent.encode(), token.encode()):
            return HttpResponse("metrics need the bearer token\n", status=401)
    elif not settings.RATEJOBS_METRICS_PUBLIC:
        return HttpResponse(
            "metrics are closed: set RATEJOBS_METRICS_TOKEN (a bearer token for the scraper) "
            "or RATEJOBS_METRICS_PUBLIC=true\n",
            status=403,
        )
    return HttpResponse(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)
