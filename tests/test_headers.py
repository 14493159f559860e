"""Rate-limit hints read from header samples as real APIs send them."""

from __future__ import annotations

import io
from http.client import parse_headers

import pytest

from ratejobs.headers import (
    MAX_DELAY_SECONDS,
    QuotaHint,
    parse_quota,
    parse_retry_after,
    throttle_delay,
)

# Our clock in every test: Tue, 14 Nov 2023 22:13:20 GMT.
NOW = 1_700_000_000.0
NOW_DATE = "Tue, 14 Nov 2023 22:13:20 GMT"


# --- Retry-After ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [("120", 120.0), ("0", 0.0), (" 30 ", 30.0), ("1.5", 1.5), ("3600", 3600.0)],
)
def test_retry_after_delta_seconds_are_seconds_to_wait(value, expected):
    assert parse_retry_after(value, now=NOW) == expected


@pytest.mark.parametrize(
    "value",
    [
        "Tue, 14 Nov 2023 22:14:50 GMT",  # IMF-fixdate
        "Tuesday, 14-Nov-23 22:14:50 GMT",  # obsolete RFC 850
        "Tue Nov 14 22:14:50 2023",  # obsolete asctime, no zone: GMT
    ],
)
def test_retry_after_http_date_in_every_format_counts_from_now(value):
    assert parse_retry_after(value, now=NOW) == pytest.approx(90.0)


def test_retry_after_asctime_with_single_digit_day_is_read():
    # asctime pads the day with a space: "Nov  6"
    value = "Sun Nov  6 08:49:37 1994"
    assert parse_retry_after(value, now=784_111_777.0 - 5) == pytest.approx(5.0)


def test_retry_after_date_in_the_past_means_no_wait():
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=NOW) == 0.0


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "soon",
        "120s",
        "2 minutes",
        "1e3",
        "0x10",
        "NaN",
        "inf",
        "1,5",
        "+5",
        "Mon, 32 Nov 2023 00:00:00 GMT",
    ],
)
def test_retry_after_garbage_is_ignored(value):
    assert parse_retry_after(value, now=NOW) is None


@pytest.mark.parametrize("value", ["-1", "-0.5", "-3600"])
def test_retry_after_negative_is_ignored(value):
    assert parse_retry_after(value, now=NOW) is None


def test_retry_after_absent_is_none():
    assert parse_retry_after(None, now=NOW) is None


@pytest.mark.parametrize(
    "value", ["315360000", "99999999999999999999", "Fri, 31 Dec 9999 23:59:59 GMT"]
)
def test_retry_after_absurdly_long_is_capped_at_a_day(value):
    assert parse_retry_after(value, now=NOW) == MAX_DELAY_SECONDS


# --- X-RateLimit-* and X-Rate-Limit-* --------------------------------------------------------


def test_github_epoch_reset_is_read_against_server_date():
    headers = {
        "Date": NOW_DATE,
        "X-RateLimit-Limit": "5000",
        "X-RateLimit-Remaining": "4999",
        "X-RateLimit-Reset": "1700003600",
        "X-RateLimit-Used": "1",
        "X-RateLimit-Resource": "core",
    }
    assert parse_quota(headers, now=NOW) == QuotaHint(
        limit=5000,
        remaining=4999,
        reset_after=3600.0,
        window=None,
        source="x-ratelimit",
    )


def test_lower_case_http2_names_read_like_canonical_ones():
    headers = {
        "date": NOW_DATE,
        "x-ratelimit-limit": "60",
        "x-ratelimit-remaining": "0",
        "x-ratelimit-reset": "1700000042",
    }
    hint = parse_quota(headers, now=NOW)
    assert (hint.limit, hint.remaining, hint.reset_after) == (60, 0, 42.0)


def test_mixed_case_names_are_matched():
    headers = {"x-RATELIMIT-remaining": "3", "X-Ratelimit-Reset": "15"}
    hint = parse_quota(headers, now=NOW)
    assert (hint.remaining, hint.reset_after) == (3, 15.0)


def test_requests_case_insensitive_dict_is_read():
    structures = pytest.importorskip("requests.structures")
    headers = structures.CaseInsensitiveDict(
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "20"}
    )
    assert throttle_delay(200, headers, now=NOW) == 20.0


def test_small_reset_is_delta_seconds():
    # given Reddit's headers: a float remaining, no limit, the reset as seconds to go
    headers = {
        "x-ratelimit-used": "2",
        "x-ratelimit-remaining": "598.0",
        "x-ratelimit-reset": "412",
    }
    assert parse_quota(headers, now=NOW) == QuotaHint(
        limit=None, remaining=598, reset_after=412.0, window=None, source="x-ratelimit"
    )


def test_reset_in_epoch_milliseconds_is_recognised():
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000030000"}
    assert parse_quota(headers, now=NOW).reset_after == pytest.approx(30.0)


def test_epoch_reset_without_date_header_uses_our_clock():
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000090"}
    assert parse_quota(headers, now=NOW).reset_after == 90.0


def test_epoch_reset_uses_server_clock_when_it_runs_ahead_of_ours():
    # given a server whose clock is 30 s ahead of ours, resetting 60 s after its own now
    headers = {
        "Date": "Tue, 14 Nov 2023 22:13:50 GMT",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": str(int(NOW) + 30 + 60),
    }
    # expect: 60 s, not the 90 s our own clock would make of it
    assert parse_quota(headers, now=NOW).reset_after == 60.0


def test_unreadable_date_header_falls_back_to_our_clock():
    headers = {
        "Date": "yesterday-ish",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1700000090",
    }
    assert parse_quota(headers, now=NOW).reset_after == 90.0


def test_epoch_reset_already_passed_means_no_wait():
    headers = {
        "Date": NOW_DATE,
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1699999990",
    }
    assert parse_quota(headers, now=NOW).reset_after == 0.0


def test_discord_reset_after_is_preferred_to_the_epoch_reset():
    # given our clock 10 s behind the epoch Discord's reset implies
    headers = {
        "X-RateLimit-Limit": "5",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1700000011.234",
        "X-RateLimit-Reset-After": "1.234",
        "X-RateLimit-Bucket": "abcd1234",
    }
    # expect: the relative value, which no clock can skew
    hint = parse_quota(headers, now=NOW)
    assert (hint.limit, hint.remaining) == (5, 0)
    assert hint.reset_after == pytest.approx(1.234)


def test_twitter_x_rate_limit_variant_is_read():
    headers = {
        "x-rate-limit-limit": "900",
        "x-rate-limit-remaining": "0",
        "x-rate-limit-reset": "1700000600",
    }
    assert parse_quota(headers, now=NOW) == QuotaHint(
        limit=900, remaining=0, reset_after=600.0, window=None, source="x-rate-limit"
    )


def test_negative_remaining_reads_as_spent():
    headers = {"X-RateLimit-Remaining": "-3", "X-RateLimit-Reset": "10"}
    assert parse_quota(headers, now=NOW).remaining == 0


def test_negative_reset_is_ignored():
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "-10"}
    hint = parse_quota(headers, now=NOW)
    assert (hint.remaining, hint.reset_after) == (0, None)


def test_absurd_delta_reset_is_capped_at_a_day():
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "500000000"}
    assert parse_quota(headers, now=NOW).reset_after == MAX_DELAY_SECONDS


def test_garbage_values_give_no_hint():
    headers = {
        "X-RateLimit-Limit": "lots",
        "X-RateLimit-Remaining": "some",
        "X-RateLimit-Reset": "soon",
    }
    assert parse_quota(headers, now=NOW) is None


def test_no_rate_limit_headers_give_no_hint():
    assert parse_quota({}, now=NOW) is None
    assert parse_quota({"Content-Type": "application/json"}, now=NOW) is None


# --- RateLimit-Limit / -Remaining / -Reset (IETF drafts up to 06, GitLab) --------------------


def test_gitlab_ratelimit_fields_with_epoch_reset():
    headers = {
        "Date": NOW_DATE,
        "RateLimit-Limit": "600",
        "RateLimit-Observed": "67",
        "RateLimit-Remaining": "533",
        "RateLimit-Reset": "1700000060",
        "RateLimit-ResetTime": "Tue, 14 Nov 2023 22:14:20 GMT",
    }
    assert parse_quota(headers, now=NOW) == QuotaHint(
        limit=600,
        remaining=533,
        reset_after=60.0,
        window=None,
        source="ratelimit-fields",
    )


def test_older_draft_fields_with_delta_reset_and_policy_window():
    headers = {
        "RateLimit-Limit": "100",
        "RateLimit-Remaining": "0",
        "RateLimit-Reset": "30",
        "RateLimit-Policy": "100;w=60",
    }
    assert parse_quota(headers, now=NOW) == QuotaHint(
        limit=100,
        remaining=0,
        reset_after=30.0,
        window=60.0,
        source="ratelimit-fields",
    )


def test_older_draft_policies_inside_ratelimit_limit_give_the_window():
    headers = {
        "RateLimit-Limit": "10, 10;w=1, 50;w=60, 1000;w=3600",
        "RateLimit-Remaining": "9",
        "RateLimit-Reset": "1",
    }
    hint = parse_quota(headers, now=NOW)
    assert (hint.limit, hint.window) == (10, 1.0)


# --- RateLimit: limit=.., remaining=.., reset=.. (IETF draft-07) -----------------------------


def test_draft_07_dictionary_with_policy():
    headers = {
        "RateLimit": "limit=100, remaining=0, reset=30",
        "RateLimit-Policy": "10;w=1, 100;w=60",
    }
    assert parse_quota(headers, now=NOW) == QuotaHint(
        limit=100,
        remaining=0,
        reset_after=30.0,
        window=60.0,
        source="ratelimit-dict",
    )


# --- RateLimit: "policy";r=..;t=.. (IETF draft-08 and later) ---------------------------------


def test_cloudflare_structured_fields():
    headers = {
        "ratelimit-policy": '"default";q=1200;w=300',
        "ratelimit": '"default";r=1199;t=1',
    }
    assert parse_quota(headers, now=NOW) == QuotaHint(
        limit=1200,
        remaining=1199,
        reset_after=1.0,
        window=300.0,
        source="ratelimit",
        policy="default",
    )


def test_spent_policy_is_chosen_over_one_with_quota_left():
    headers = {
        "RateLimit-Policy": '"burst";q=100;w=60, "daily";q=1000;w=86400',
        "RateLimit": '"burst";r=50;t=30, "daily";r=0;t=3600',
    }
    hint = parse_quota(headers, now=NOW)
    assert hint == QuotaHint(
        limit=1000,
        remaining=0,
        reset_after=3600.0,
        window=86400.0,
        source="ratelimit",
        policy="daily",
    )


def test_of_two_spent_policies_the_longer_reset_is_chosen():
    headers = {
        "RateLimit-Policy": '"permin";q=50;w=60,"perhr";q=1000;w=3600',
        "RateLimit": '"permin";r=0;t=12,"perhr";r=0;t=1800',
    }
    assert parse_quota(headers, now=NOW).policy == "perhr"


def test_lowest_remaining_wins_over_longest_reset():
    headers = {
        "RateLimit-Policy": '"burst";q=10;w=1, "daily";q=5000;w=86400',
        "RateLimit": '"burst";r=0;t=1, "daily";r=20;t=40000',
    }
    assert parse_quota(headers, now=NOW).policy == "burst"


def test_policy_named_by_token_instead_of_string_is_read():
    headers = {"RateLimit-Policy": "default;q=100;w=10", "RateLimit": "default;r=3;t=7"}
    hint = parse_quota(headers, now=NOW)
    assert (hint.limit, hint.remaining, hint.reset_after, hint.window) == (
        100,
        3,
        7.0,
        10.0,
    )


def test_ratelimit_without_matching_policy_still_gives_remaining():
    hint = parse_quota({"RateLimit": '"default";r=0;t=30'}, now=NOW)
    assert (hint.limit, hint.remaining, hint.reset_after) == (None, 0, 30.0)


def test_policy_alone_gives_limit_and_window_but_no_remaining():
    hint = parse_quota({"RateLimit-Policy": '"default";q=100;w=60'}, now=NOW)
    assert (hint.limit, hint.window, hint.remaining, hint.reset_after) == (
        100,
        60.0,
        None,
        None,
    )


def test_malformed_structured_field_is_discarded_whole():
    # given a trailing comma, which RFC 8941 says fails the whole field
    assert parse_quota({"RateLimit": '"default";r=0;t=30,'}, now=NOW) is None


def test_most_restrictive_hint_wins_across_conventions():
    # given an API that sends both its legacy headers and the IETF fields
    headers = {
        "X-RateLimit-Limit": "100",
        "X-RateLimit-Remaining": "10",
        "X-RateLimit-Reset": "30",
        "RateLimit-Policy": '"hourly";q=1000;w=3600',
        "RateLimit": '"hourly";r=0;t=1200',
    }
    hint = parse_quota(headers, now=NOW)
    assert (hint.source, hint.remaining, hint.reset_after) == ("ratelimit", 0, 1200.0)


def test_repeated_fields_from_http_client_are_combined():
    # given http.client headers, where each RateLimit line is a separate item
    raw = (
        b'RateLimit-Policy: "burst";q=100;w=60\r\n'
        b'RateLimit-Policy: "daily";q=1000;w=86400\r\n'
        b'RateLimit: "burst";r=80;t=20\r\n'
        b'RateLimit: "daily";r=0;t=600\r\n'
        b"\r\n"
    )
    headers = parse_headers(io.BytesIO(raw))
    assert parse_quota(headers, now=NOW).policy == "daily"


# --- throttle_delay ---------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_status_waits_for_retry_after(status):
    assert throttle_delay(status, {"Retry-After": "4"}, now=NOW) == 4.0


def test_retry_after_date_is_read_on_the_server_clock():
    # given a server 30 s ahead of us asking for 120 s by its clock
    headers = {
        "Date": "Tue, 14 Nov 2023 22:13:50 GMT",
        "Retry-After": "Tue, 14 Nov 2023 22:15:50 GMT",
    }
    assert throttle_delay(429, headers, now=NOW) == 120.0


def test_retry_after_date_without_date_header_uses_our_clock():
    headers = {"Retry-After": "Tue, 14 Nov 2023 22:15:50 GMT"}
    assert throttle_delay(503, headers, now=NOW) == 150.0


def test_ietf_draft_429_example_waits_for_retry_after():
    headers = {
        "Retry-After": "30",
        "RateLimit-Policy": '"default";q=100;w=60',
        "RateLimit": '"default";r=0;t=30',
    }
    assert throttle_delay(429, headers, now=NOW) == 30.0


def test_429_without_retry_after_waits_for_spent_quota_reset():
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"}
    assert throttle_delay(429, headers, now=NOW) == 30.0


def test_429_with_garbage_retry_after_falls_back_to_quota():
    headers = {
        "Retry-After": "later",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "30",
    }
    assert throttle_delay(429, headers, now=NOW) == 30.0


def test_429_without_hints_says_nothing():
    # the limiter applies its own default block then
    assert throttle_delay(429, {}, now=NOW) is None
    assert throttle_delay(429, {"Retry-After": "soon"}, now=NOW) is None


def test_longer_of_retry_after_and_spent_quota_wins():
    # given a 429 asking for 1 s while the hourly quota is spent for another 3600 s
    headers = {
        "Retry-After": "1",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "3600",
    }
    assert throttle_delay(429, headers, now=NOW) == 3600.0


def test_success_with_spent_quota_blocks_before_any_429():
    headers = {
        "Date": NOW_DATE,
        "X-RateLimit-Limit": "60",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1700000045",
    }
    assert throttle_delay(200, headers, now=NOW) == 45.0


def test_success_with_quota_left_says_nothing():
    headers = {"X-RateLimit-Remaining": "10", "X-RateLimit-Reset": "30"}
    assert throttle_delay(200, headers, now=NOW) is None


def test_success_with_spent_quota_already_reset_says_nothing():
    headers = {
        "Date": NOW_DATE,
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1699999000",
    }
    assert throttle_delay(200, headers, now=NOW) is None


def test_spent_quota_without_reset_says_nothing():
    assert throttle_delay(200, {"X-RateLimit-Remaining": "0"}, now=NOW) is None


@pytest.mark.parametrize("status", [200, 201, 301, 404])
def test_retry_after_is_ignored_outside_throttling_statuses(status):
    assert throttle_delay(status, {"Retry-After": "120"}, now=NOW) is None


def test_github_secondary_limit_403_waits_for_retry_after():
    headers = {"Retry-After": "60", "X-RateLimit-Remaining": "4000"}
    assert throttle_delay(403, headers, now=NOW) == 60.0


def test_github_primary_limit_403_waits_for_reset():
    headers = {
        "Date": NOW_DATE,
        "X-RateLimit-Limit": "5000",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1700001800",
        "X-RateLimit-Resource": "core",
    }
    assert throttle_delay(403, headers, now=NOW) == 1800.0


def test_success_with_spent_ietf_policy_blocks_until_its_reset():
    headers = {
        "RateLimit-Policy": '"burst";q=100;w=60, "daily";q=1000;w=86400',
        "RateLimit": '"burst";r=99;t=59, "daily";r=0;t=7200',
    }
    assert throttle_delay(200, headers, now=NOW) == 7200.0


def test_absurd_retry_after_blocks_for_at_most_a_day():
    assert throttle_delay(429, {"Retry-After": "315360000"}, now=NOW) == MAX_DELAY_SECONDS
