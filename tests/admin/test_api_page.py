"""The API page: live limiter state from Redis, reset and block, live limits, masked secrets."""

from __future__ import annotations

import dataclasses

from django.urls import reverse

from ratejobs.admin.apis import rate_story_text
from ratejobs.infra.limiters import api_limiter
from ratejobs.models import Api, ThrottleEvent

SECRET = "api-secret-credential"  # the `api` fixture's credential


def change_url(api: Api) -> str:
    return reverse("admin:ratejobs_api_change", args=[api.pk])


def limits_rows(windows: list[dict], *, spare: int = 2) -> dict[str, str]:
    """The More limits rows as the page posts them: one per window (its period in seconds, or
    in a "period_unit" the window names), then `spare` empty rows."""
    data = {}
    for index, window in enumerate([*windows, *[{}] * spare]):
        for name, default in (("rate", ""), ("period", ""), ("period_unit", "seconds"),
                              ("burst", ""), ("unit", "requests")):  # fmt: skip
            data[f"limits-{index}-{name}"] = str(window.get(name, default))
    return data


def form_data(api: Api, *, limits: list[dict] | None = None, **changes) -> dict:
    """The change form as posted, with `changes`; `limits` as rows (by default the API's)."""
    data = {
        "base_url": api.base_url,
        "rate": api.rate,
        "period": api.period,
        "burst": api.burst,
        "max_concurrency": api.max_concurrency,
        "min_rate": "",
        "max_attempts": api.max_attempts,
        "max_throttled_retries": api.max_throttled_retries,
        "timeout": api.timeout,
        "default_headers": "{}",
        "auth_header": api.auth_header,
        "credential": "",
        "credential_env": "",
        **limits_rows(api.limits if limits is None else limits),
    }
    data.update(changes)
    return data


def test_the_api_page_shows_the_live_limiter_state_and_never_the_secret(root_client, api):
    html = root_client.get(change_url(api)).content.decode()
    assert "Shared limiter, live from Redis" in html
    assert "rate now" in html and "10/s" in html and "not blocked" in html
    assert "stored (encrypted)" in html
    assert SECRET not in html
    listing = root_client.get(reverse("admin:ratejobs_api_changelist")).content.decode()
    assert api.name in listing and SECRET not in listing and "stored (encrypted)" in listing


def test_block_stops_every_worker_and_is_recorded_and_reset_clears_it(root_client, api):
    response = root_client.post(
        reverse("admin:ratejobs_api_block", args=[api.pk]),
        {"seconds": "30", "post": "yes"},
        follow=True,
    )
    assert "Every worker waits 30 s" in response.content.decode()
    assert 29 < api_limiter(api).state().blocked_for <= 30
    assert ThrottleEvent.objects.filter(api=api, kind="blocked", retry_after=30).count() == 1
    assert "blocked for" in root_client.get(change_url(api)).content.decode()
    root_client.post(reverse("admin:ratejobs_api_reset", args=[api.pk]), {"post": "yes"})
    assert api_limiter(api).state().blocked_for == 0


def test_a_block_without_a_sensible_duration_is_refused(root_client, api):
    for seconds in ("", "-1", "abc", "1e9"):
        response = root_client.post(
            reverse("admin:ratejobs_api_block", args=[api.pk]),
            {"seconds": seconds, "post": "yes"},
            follow=True,
        )
        assert "Block for how long?" in response.content.decode()
    assert api_limiter(api).state().blocked_for == 0


def test_editing_the_rate_reaches_the_shared_limiter_at_once(
    root_client, api, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = root_client.post(change_url(api), form_data(api, rate=25, burst=3))
    assert response.status_code == 302, response.content.decode()[:2000]
    state = api_limiter(api).state()
    assert (state.rate, state.burst) == (25, 3)
    api.refresh_from_db()
    assert api.credential_encrypted  # an empty secret field keeps the stored secret
    # a new version of the limits, which Redis now holds; a change of anything else is not one
    assert state.config_version == api.limits_version == 2
    root_client.post(change_url(api), form_data(api, rate=25, burst=3, timeout=12))
    api.refresh_from_db()
    assert (api.timeout, api.limits_version) == (12, 2)


def test_a_new_secret_is_stored_encrypted_and_can_be_removed(root_client, api):
    root_client.post(change_url(api), form_data(api, credential="new-canary-secret"))
    api.refresh_from_db()
    assert api.credential_encrypted and "new-canary-secret" not in api.credential_encrypted
    assert "new-canary-secret" not in root_client.get(change_url(api)).content.decode()
    root_client.post(change_url(api), form_data(api, clear_credential="on"))
    api.refresh_from_db()
    assert api.credential_encrypted == ""


def test_bad_limits_are_shown_on_the_form_and_nothing_changes(root_client, api):
    response = root_client.post(change_url(api), form_data(api, rate=0, base_url="ftp://x"))
    assert response.status_code == 200
    assert "errornote" in response.content.decode()
    api.refresh_from_db()
    assert api.rate == 10.0


def test_an_api_added_in_the_admin_configures_its_limiter(
    root_client, unique_name, django_capture_on_commit_callbacks
):
    data = form_data(Api(base_url="https://example.com/v1", rate=7), name=unique_name)
    with django_capture_on_commit_callbacks(execute=True):
        response = root_client.post(reverse("admin:ratejobs_api_add"), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    api = Api.objects.get(name=unique_name)
    assert api_limiter(api).state().rate == 7


def test_the_api_page_tells_the_rate_and_the_learned_limit_as_one_story(root_client, api):
    # given an API that is not adaptive: its rate is the ceiling, nothing to learn
    html = root_client.get(change_url(api)).content.decode()
    assert "10/s, the configured ceiling (not adaptive)" in html
    # expect: no separate "learned limit" or "current rate" row to contradict it, and no
    # "generation" (a count of schedule resets, nothing an operator acts on)
    assert "learned limit" not in html and "current rate" not in html
    assert "generation" not in html.lower()
    # and, from limiter states that learned a real limit of 12/s under a ceiling of 20/s
    state = dataclasses.replace(
        api_limiter(api).state(), adaptive=True, rate=20.0, period=1.0, learned_rate=12.0
    )
    stories = {
        rate: rate_story_text(dataclasses.replace(state, current_rate=rate))
        for rate in (11.88, 13.3, 8.4)
    }
    assert stories[11.88] == "holding 11.9/s, just under the 12/s it learned; ceiling 20/s"
    assert stories[13.3] == "probing at 13.3/s, above the 12/s it learned; ceiling 20/s"
    assert stories[8.4] == "cut to 8.4/s after a 429, below the 12/s it learned; ceiling 20/s"
    unmeasured = dataclasses.replace(state, learned_rate=None, current_rate=14.0)
    assert rate_story_text(unmeasured) == (
        "cut to 14/s after a 429, climbing back; no limit learned yet; ceiling 20/s"
    )


def test_the_api_page_tells_each_429_in_one_row_with_the_rate_cut_it_caused(
    root_client, api, make_job
):
    # given a 429 and the rate cut written for it, as services.calls writes them (period 1 s)
    call = make_job(calls=2).calls.get(index=1)
    common = {"api": api, "job": call.job, "call": call}
    ThrottleEvent.objects.bulk_create([
        ThrottleEvent(kind="throttled", status_code=429, retry_after=1.0, rate_before=10,
                      rate_after=7, **common),
        ThrottleEvent(kind="rate_decreased", rate_before=10, rate_after=7, **common),
    ])  # fmt: skip
    html = root_client.get(change_url(api)).content.decode()
    # expect: one row, in words, with units; no separate "rate decreased" row
    assert "429 received · Retry-After 1.0 s · rate 10.0/s → 7.0/s" in html
    assert "rate decreased" not in html
    # and the table says what it lists
    assert "429s and blocks, last hour" in html


def test_an_api_whose_limiter_is_not_in_redis_yet_is_shown_not_a_500(
    root_client, make_api, redis_client
):
    # given: an API made while Redis was down (its on-commit configure never ran), or whose
    # keys were flushed: nothing of its limiter in Redis
    api = make_api()
    redis_client.delete(*api_limiter(api).keys)
    pages = [
        reverse("admin:ratejobs_api_changelist"),
        reverse("admin:ratejobs_api_change", args=[api.pk]),
        reverse("ratejobs_overview"),
        reverse("ratejobs_overview_data"),
    ]
    for url in pages:
        page = root_client.get(url)
        assert page.status_code == 200, url
    change = root_client.get(pages[1]).content.decode()
    assert "limiter not in Redis yet" in change


def test_the_api_form_gives_units_and_a_plain_group_list(root_client, api):
    html = root_client.get(change_url(api)).content.decode()
    # expect: the period and the floor in their units, the extra limits with an example
    assert "Period (seconds)" in html and "Floor (requests per period)" in html
    assert "More limits" in html and "1,000 requests per 1 hour with a burst of 100" in html
    # as rows (two empty ones for an API without windows), not a JSON box
    assert 'name="limits-1-period_unit"' in html and "limits-2-" not in html
    assert "More limits (JSON)" not in html and 'name="limits"' not in html
    # and the groups as checkboxes under one sentence, not the two-pane picker
    assert "Only members of the ticked groups" in html
    assert "Hold down" not in html and "SelectFilter" not in html
