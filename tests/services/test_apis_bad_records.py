"""One bad record never stops the machine: every number an API takes is bounded by what the
limiter and the dispatcher carry (and the schema says so), and a record that slipped past
(stored before the bounds, or by hand) stops only itself in the reconciler."""

from __future__ import annotations

import logging

import pytest

from ratejobs.limiter import Limiter, LimiterConfig, WaitTooLong
from ratejobs.limiter.config import MAX_BURST, MAX_CONCURRENCY, MAX_PERIOD, MAX_RATE
from ratejobs.models import MAX_THROTTLED_RETRIES, Api, Call, ThrottleEvent
from ratejobs.worker.dispatch import calls_per_message, dispatch_window
from ratejobs.worker.reconcile import reconcile
from tests.rest.test_apis import api_payload
from tests.worker.test_dispatch import LOCK_WAIT_TIMEOUT_SECONDS, backend_pid, wait_until_blocked

HUGE = 1.7976931348623157e308  # what a schemathesis run got stored as a rate


@pytest.mark.parametrize(
    ("fields", "bad"),
    [
        ({"rate": HUGE}, "rate"),
        ({"rate": MAX_RATE * 2}, "rate"),
        ({"period": MAX_PERIOD * 2}, "period"),
        ({"burst": MAX_BURST + 1}, "burst"),
        ({"max_concurrency": MAX_CONCURRENCY + 1}, "max_concurrency"),
        ({"min_rate": HUGE}, "min_rate"),
        ({"max_throttled_retries": MAX_THROTTLED_RETRIES + 1}, "max_throttled_retries"),
        ({"timeout": 1e9}, "timeout"),
        ({"max_attempts": 10**6}, "max_attempts"),
    ],
)
def test_numbers_past_what_the_limiter_carries_are_400_and_nothing_is_stored(
    client_for, manager, unique_name, fields, bad
):
    response = client_for(manager).post(
        "/api/apis/", api_payload(unique_name, **fields), format="json"
    )
    assert response.status_code == 400, response.json()
    assert bad in response.json()
    assert not Api.objects.filter(name=unique_name).exists()


@pytest.mark.parametrize(
    ("rate", "period"),
    [
        (MAX_RATE, 0.5),  # two million a second
        (1e-6, 100.0),  # one request in 10^8 s (three years): longer than MAX_PERIOD
    ],
)
def test_a_rate_per_second_outside_the_limiters_range_is_400(
    client_for, manager, unique_name, rate, period
):
    payload = api_payload(unique_name, rate=rate, period=period, min_rate=None)
    response = client_for(manager).post("/api/apis/", payload, format="json")
    assert response.status_code == 400, response.json()
    errors = str(response.json())
    assert "rate / period" in errors or "period / rate" in errors
    assert not Api.objects.filter(name=unique_name).exists()


def test_the_schema_documents_the_bounds(client_for):
    schema = client_for(None).get("/api/schema/?format=json").json()
    fields = schema["components"]["schemas"]["ApiCreateInput"]["properties"]
    assert fields["rate"]["maximum"] == MAX_RATE
    assert fields["burst"]["maximum"] == MAX_BURST
    assert fields["max_concurrency"]["maximum"] == MAX_CONCURRENCY
    assert fields["period"]["maximum"] == MAX_PERIOD


def test_the_limiter_and_the_dispatcher_carry_every_api_within_the_bounds(
    redis_client, unique_name
):
    # the fastest and the slowest API an operator can store
    fastest = LimiterConfig(
        rate=MAX_RATE, period=1.0, burst=MAX_BURST, max_concurrency=MAX_CONCURRENCY
    )
    slowest = LimiterConfig(rate=1.0, period=MAX_PERIOD)
    for config in (fastest, slowest):
        limiter = Limiter(redis_client, f"{unique_name}-{config.rate}", config)
        try:
            limiter.release(limiter.acquire(max_wait=0))
            if config is slowest:  # the next slot is a leap year away, and says so
                with pytest.raises(WaitTooLong) as waited:
                    limiter.acquire(max_wait=0)
                assert waited.value.retry_after == pytest.approx(MAX_PERIOD, rel=1e-3)
        finally:
            limiter.reset()
        api = Api(name="x", base_url="https://x.example", rate=config.rate, period=config.period)
        assert dispatch_window(api) >= 1
        assert calls_per_message(api) >= 1


@pytest.mark.django_db(transaction=True)
def test_an_api_the_reconciler_cannot_dispatch_stops_only_itself(make_api, user, caplog):
    from ratejobs.services.jobs import job_create

    broken, sound = make_api(), make_api()
    for api in (broken, sound):
        job_create(owner=user, api=api, name="a job", calls=[{"path": "/x"}] * 3)
    # stored before the bounds existed, or by hand
    Api.objects.filter(pk=broken.pk).update(rate=HUGE)
    Call.objects.update(dispatched_at=None)
    with caplog.at_level(logging.ERROR, logger="ratejobs.worker.reconcile"):
        result = reconcile()
    # expect: the sound API's calls went to the broker; the broken one is named in the log
    assert Call.objects.filter(job__api=sound, dispatched_at__isnull=False).count() == 3
    assert Call.objects.filter(job__api=broken, dispatched_at__isnull=False).count() == 0
    assert f"could not dispatch API {broken.pk}" in caplog.text
    assert result.apis == 2


def test_every_throttle_event_kind_the_admin_filters_by_is_one_ratejobs_writes():
    # "rate restored" was offered and never written: filtering by it always showed nothing
    written = {
        "throttled": "services.calls: a 429 fed back to the limiter",
        "quota_exhausted": "services.calls: headers saying the quota is spent",
        "rate_decreased": "services.calls: the first throttle of a burst, adaptive",
        "blocked": "services.apis.api_block: an operator's block",
    }
    assert set(ThrottleEvent.Kind.values) == set(written)


@pytest.mark.postgresql
@pytest.mark.django_db(transaction=True)
def test_two_concurrent_creates_of_one_api_name_give_one_api_and_one_clear_error(unique_name):
    import threading

    from django.core.exceptions import ValidationError
    from django.db import connection, transaction

    from ratejobs.services.apis import api_create

    fields = {"name": unique_name, "base_url": "https://api.example.com", "rate": 5}
    inserted, connected, go_on = threading.Event(), threading.Event(), threading.Event()
    outcomes: dict[str, object] = {}
    pids: dict[str, int] = {}

    def first() -> None:
        try:
            pids["first"] = backend_pid()
            with transaction.atomic():  # inserted but not committed while the second checks
                outcomes["first"] = api_create(**fields)
                inserted.set()
                go_on.wait(LOCK_WAIT_TIMEOUT_SECONDS)
        finally:
            inserted.set()
            connection.close()

    def second() -> None:
        inserted.wait(LOCK_WAIT_TIMEOUT_SECONDS)
        try:
            pids["second"] = backend_pid()
            connected.set()
            outcomes["second"] = api_create(**fields)
        except Exception as exc:  # noqa: BLE001 - what it raised is the result
            outcomes["second"] = exc
        finally:
            connected.set()
            connection.close()

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    try:
        assert inserted.wait(LOCK_WAIT_TIMEOUT_SECONDS) and "first" in outcomes, outcomes
        assert connected.wait(LOCK_WAIT_TIMEOUT_SECONDS) and "second" in pids, outcomes
        # the second is past its check: its insert waits for the first's uncommitted row
        wait_until_blocked(pids["second"], pids["first"])
    finally:
        go_on.set()
    for thread in threads:
        thread.join(30)
    # expect: one API, and a 400-style error naming the field, never an IntegrityError (500)
    assert Api.objects.filter(name=unique_name).count() == 1
    assert isinstance(outcomes["second"], ValidationError), outcomes["second"]
    assert "name" in outcomes["second"].message_dict


@pytest.mark.parametrize(
    "fields",
    [
        {"rate": HUGE},
        {"burst": MAX_BURST + 1},
        {"rate": MAX_RATE, "period": 0.5},
        {"max_throttled_retries": MAX_THROTTLED_RETRIES + 1},
    ],
)
@pytest.mark.django_db
def test_the_service_refuses_them_too_for_the_admin_and_the_command_line(unique_name, fields):
    # the REST serializer's bounds answer first there; the model's hold for every other way in
    from django.core.exceptions import ValidationError

    from ratejobs.services.apis import api_create

    with pytest.raises(ValidationError):
        api_create(name=unique_name, base_url="https://api.example.com", **{"rate": 5, **fields})
    assert not Api.objects.filter(name=unique_name).exists()


@pytest.mark.parametrize(
    "fields",
    [{"rate": HUGE}, {"burst": MAX_BURST + 1}, {"rate": MAX_RATE, "period": 0.5}],
)
def test_the_limiter_refuses_limits_it_cannot_carry(fields):
    with pytest.raises(ValueError, match="at most|from 1 to"):
        LimiterConfig(**{"rate": 5, **fields})
