"""Rate-limit hints read from header samples as real APIs send them."""

from __future__ import annotations

import io
import math
from http.client import parse_headers

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratejobs.limiter import headers as headers_module
from ratejobs.limiter.config import MAX_COST
from ratejobs.limiter.cost import cost_from_response
from ratejobs.limiter.headers import (
    MAX_DELAY_SECONDS,
    MAX_DIGITS,
    UNKNOWN_RESET_PROBE_SECONDS,
    QuotaHint,
    Source,
    parse_quota,
    parse_retry_after,
    throttle_delay,
)
from ratejobs.limiter.headers.values import normalise

# Our clock (the limiter's, Redis TIME) in every test: Tue, 14 Nov 2023 22:13:20 GMT.
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


@pytest.mark.parametrize(
    "headers",
    [
        {"Retry-After": "Tue, 14 Nov 2023 22:14:50 GMT"},
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000090"},
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000090000"},
        {"RateLimit-Remaining": "0", "RateLimit-Reset": "Tue, 14 Nov 2023 22:14:50 GMT"},
        {"anthropic-ratelimit-requests-remaining": "0",
         "anthropic-ratelimit-requests-reset": "2023-11-14T22:14:50Z"},
    ],
)  # fmt: skip
def test_a_reset_given_as_a_moment_is_read_on_the_date_or_the_clock_given_never_another(headers):
    # given a reset 90 s after our clock, which the server's Date puts 30 s away
    dated = {**headers, "Date": "Tue, 14 Nov 2023 22:14:20 GMT"}
    # expect: the Date's reading with it whatever clock is given, ours without it, and none
    # with neither (a worker's own clock is never the fallback)
    for now in (NOW, None, NOW + 3600):
        assert throttle_delay(429, dated, now=now) == pytest.approx(30.0)
    assert throttle_delay(429, headers, now=NOW) == pytest.approx(90.0)
    assert throttle_delay(429, headers, now=None) is None


def test_a_delta_reset_needs_no_clock():
    assert parse_retry_after("90", now=None) == 90.0
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "90"}
    assert parse_quota(headers, now=None).reset_after == 90.0


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


def test_negative_remaining_reads_as_spent():
    headers = {"X-RateLimit-Remaining": "-3", "X-RateLimit-Reset": "10"}
    assert parse_quota(headers, now=NOW).remaining == 0


def test_negative_reset_is_ignored():
    headers = {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "-10"}
    hint = parse_quota(headers, now=NOW)
    assert (hint.remaining, hint.reset_after) == (0, None)


# --- RateLimit-Limit / -Remaining / -Reset (IETF drafts up to 06, GitLab) --------------------


def test_older_draft_policies_inside_ratelimit_limit_give_the_window():
    headers = {
        "RateLimit-Limit": "10, 10;w=1, 50;w=60, 1000;w=3600",
        "RateLimit-Remaining": "9",
        "RateLimit-Reset": "1",
    }
    hint = parse_quota(headers, now=NOW)
    assert (hint.limit, hint.window) == (10, 1.0)


# --- RateLimit: "policy";r=..;t=.. (IETF draft-08 and later) ---------------------------------


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


# --- OpenAI: x-ratelimit-{limit,remaining,reset}-{requests,tokens} ----------------------------
# https://platform.openai.com/docs/guides/rate-limits ("Rate limits in headers": its sample
# values are the ones below)
OPENAI_DOC_SAMPLE = {
    "x-ratelimit-limit-requests": "60",
    "x-ratelimit-limit-tokens": "150000",
    "x-ratelimit-remaining-requests": "59",
    "x-ratelimit-remaining-tokens": "149984",
    "x-ratelimit-reset-requests": "1s",
    "x-ratelimit-reset-tokens": "6m0s",
}


def test_openai_documented_sample_gives_one_hint_per_dimension():
    hint = parse_quota(OPENAI_DOC_SAMPLE, now=NOW)
    # the requests dimension has fewer left (59 against 149984), so it is the one reported
    assert hint == QuotaHint(
        limit=60, remaining=59, reset_after=1.0, window=None, source="openai", policy="requests"
    )
    assert throttle_delay(200, OPENAI_DOC_SAMPLE, now=NOW) is None


def test_openai_spent_tokens_block_for_their_reset_though_requests_remain():
    # given the documented sample with the tokens of this minute used up
    headers = {**OPENAI_DOC_SAMPLE, "x-ratelimit-remaining-tokens": "0"}
    hint = parse_quota(headers, now=NOW)
    assert (hint.source, hint.policy, hint.remaining, hint.reset_after) == (
        "openai",
        "tokens",
        0,
        360.0,
    )
    # expect: a 200 blocks every worker for the 6 minutes, before any 429
    assert throttle_delay(200, headers, now=NOW) == 360.0


def test_discord_reset_after_is_not_an_openai_dimension():
    headers = {"X-RateLimit-Reset-After": "1.5", "X-RateLimit-Remaining": "0"}
    assert parse_quota(headers, now=NOW).source == "discord"


# --- Anthropic: anthropic-ratelimit-*-{limit,remaining,reset} ---------------------------------
# https://docs.anthropic.com/en/api/rate-limits ("Response headers"): the page names the fields
# and gives the resets "in RFC 3339 format"; it has no sample values, so these are in that format.
ANTHROPIC = {
    "Date": NOW_DATE,
    "anthropic-ratelimit-requests-limit": "50",
    "anthropic-ratelimit-requests-remaining": "49",
    "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:21Z",
    "anthropic-ratelimit-tokens-limit": "48000",
    "anthropic-ratelimit-tokens-remaining": "47000",
    "anthropic-ratelimit-tokens-reset": "2023-11-14T22:13:22Z",
    "anthropic-ratelimit-input-tokens-limit": "40000",
    "anthropic-ratelimit-input-tokens-remaining": "40000",
    "anthropic-ratelimit-input-tokens-reset": "2023-11-14T22:13:20Z",
    "anthropic-ratelimit-output-tokens-limit": "8000",
    "anthropic-ratelimit-output-tokens-remaining": "7000",
    "anthropic-ratelimit-output-tokens-reset": "2023-11-14T22:13:22Z",
}


def test_anthropic_headers_are_read_with_rfc3339_resets():
    assert parse_quota(ANTHROPIC, now=NOW) == QuotaHint(
        limit=50, remaining=49, reset_after=1.0, window=None, source="anthropic", policy="requests"
    )
    assert throttle_delay(200, ANTHROPIC, now=NOW) is None


def test_anthropic_spent_output_tokens_block_until_their_reset():
    # given output tokens spent (the page: token counts are rounded to the nearest thousand, so
    # "0" may hide a few hundred: we take it as spent) for another minute
    headers = {
        **ANTHROPIC,
        "anthropic-ratelimit-output-tokens-remaining": "0",
        "anthropic-ratelimit-output-tokens-reset": "2023-11-14T22:14:20Z",
    }
    hint = parse_quota(headers, now=NOW)
    assert (hint.policy, hint.remaining, hint.reset_after) == ("output-tokens", 0, 60.0)
    assert throttle_delay(200, headers, now=NOW) == 60.0


# --- Shopify: X-Shopify-Shop-Api-Call-Limit, a leaky bucket -----------------------------------
# https://shopify.dev/docs/api/admin-rest/usage/rate-limits (the header, "32/40", a bucket of 40
# that leaks 2 requests/s on the standard plan, and a 429's "Retry-After: 2.0")


@pytest.mark.parametrize(
    ("value", "remaining"), [("32/40", 8), ("39/40", 1), ("1/40", 39), ("0/80", 80)]
)
def test_shopify_bucket_with_room_says_how_much(value, remaining):
    hint = parse_quota({"X-Shopify-Shop-Api-Call-Limit": value}, now=NOW)
    assert (hint.source, hint.remaining, hint.reset_after) == ("shopify", remaining, 0.0)
    assert throttle_delay(200, {"X-Shopify-Shop-Api-Call-Limit": value}, now=NOW) is None


def test_shopify_full_bucket_blocks_until_one_request_leaks():
    headers = {"X-Shopify-Shop-Api-Call-Limit": "40/40"}
    assert parse_quota(headers, now=NOW) == QuotaHint(
        limit=40, remaining=0, reset_after=0.5, window=None, source="shopify"
    )
    assert throttle_delay(200, headers, now=NOW) == 0.5


# --- ISO 8601 resets: Mastodon and Jira --------------------------------------------------------


def test_mastodon_iso8601_reset_is_read():
    # https://docs.joinmastodon.org/api/rate-limits/ ("X-RateLimit-Reset: Timestamp when your
    # rate limit will reset"; its timestamps are ISO 8601 with milliseconds and Z,
    # https://docs.joinmastodon.org/api/datetime-format/); a real server sends microseconds
    headers = {
        "Date": NOW_DATE,
        "X-RateLimit-Limit": "300",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "2023-11-14T22:15:00.019685Z",
    }
    hint = parse_quota(headers, now=NOW)
    assert (hint.source, hint.limit, hint.remaining) == ("x-ratelimit", 300, 0)
    assert hint.reset_after == pytest.approx(100.019685)
    assert throttle_delay(200, headers, now=NOW) == pytest.approx(100.019685)


def test_jira_minute_precision_reset_and_retry_after():
    # https://developer.atlassian.com/cloud/jira/platform/rate-limiting/ (429s carry Retry-After
    # and X-RateLimit-Reset, "the timestamp (in ISO 8601 format) when the rate limit will reset
    # ... in the format yyyy-MM-ddTHH:mmZ")
    headers = {
        "Date": NOW_DATE,
        "Retry-After": "95",
        "X-RateLimit-Limit": "350",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "2023-11-14T22:15Z",
    }
    assert parse_quota(headers, now=NOW).reset_after == 100.0
    assert throttle_delay(429, headers, now=NOW) == 100.0


# --- Reddit: fractional remaining, used, reset in seconds --------------------------------------
# https://www.reddit.com/r/redditdev/comments/1yxrp7/formal_ratelimiting_headers/ ("X-Ratelimit-
# Used: approximate number of requests used in this period; -Remaining: ... left to use; -Reset:
# approximate number of seconds to end of period"; the window is 10 minutes)


def test_reddit_spent_fractional_remaining_blocks_until_the_period_ends():
    headers = {
        "X-Ratelimit-Used": "600",
        "X-Ratelimit-Remaining": "0.0",
        "X-Ratelimit-Reset": "412",
    }
    hint = parse_quota(headers, now=NOW)
    assert (hint.source, hint.remaining, hint.reset_after) == ("x-ratelimit", 0, 412.0)
    assert throttle_delay(200, headers, now=NOW) == 412.0


# --- Discord: Reset-After, scope and the global flag -------------------------------------------
# https://discord.com/developers/docs/topics/rate-limits ("Header Format" and "Exceeding A Rate
# Limit": the sample values below)


def test_discord_documented_per_route_headers():
    headers = {
        "X-RateLimit-Limit": "5",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1470173023",
        "X-RateLimit-Reset-After": "1",
        "X-RateLimit-Bucket": "abcd1234",
    }
    assert parse_quota(headers, now=NOW) == QuotaHint(
        limit=5, remaining=0, reset_after=1.0, window=None, source="discord"
    )
    # expect: the relative reset, though the epoch one is years in our past
    assert throttle_delay(200, headers, now=NOW) == 1.0


def test_discord_documented_429_with_user_scope():
    headers = {
        "Retry-After": "65",
        "X-RateLimit-Limit": "10",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset": "1470173023.123",
        "X-RateLimit-Reset-After": "64.57",
        "X-RateLimit-Bucket": "abcd1234",
        "X-RateLimit-Scope": "user",
    }
    hint = parse_quota(headers, now=NOW)
    assert (hint.policy, hint.reset_after) == ("user", 64.57)
    assert throttle_delay(429, headers, now=NOW) == 65.0


def test_discord_global_flag_names_the_scope():
    headers = {
        "X-RateLimit-Global": "true",
        "X-RateLimit-Remaining": "0",
        "X-RateLimit-Reset-After": "0.75",
    }
    hint = parse_quota(headers, now=NOW)
    assert (hint.source, hint.policy, hint.reset_after) == ("discord", "global", 0.75)


# --- HubSpot: X-HubSpot-RateLimit-* -------------------------------------------------------------
# https://developers.hubspot.com/docs/api/usage-details ("Rate limits": the headers, a burst
# window given in milliseconds, a daily limit for API keys and private apps, the deprecated
# per-second ones) and the changelog that introduced them,
# https://developers.hubspot.com/changelog/2018-11-06-rate-limit-information-headers-will-be-included-in-http-responses
HUBSPOT = {
    "X-HubSpot-RateLimit-Daily": "250000",
    "X-HubSpot-RateLimit-Daily-Remaining": "249000",
    "X-HubSpot-RateLimit-Interval-Milliseconds": "10000",
    "X-HubSpot-RateLimit-Max": "100",
    "X-HubSpot-RateLimit-Remaining": "97",
    "X-HubSpot-RateLimit-Secondly": "10",
    "X-HubSpot-RateLimit-Secondly-Remaining": "9",
}


def test_hubspot_headers_with_room_say_so():
    hint = parse_quota(HUBSPOT, now=NOW)
    assert (hint.source, hint.policy, hint.limit, hint.remaining, hint.window) == (
        "hubspot",
        "secondly",
        10,
        9,
        1.0,
    )
    assert throttle_delay(200, HUBSPOT, now=NOW) is None


def test_hubspot_spent_burst_window_blocks_a_whole_window():
    headers = {**HUBSPOT, "X-HubSpot-RateLimit-Remaining": "0"}
    hint = parse_quota(headers, now=NOW)
    assert (hint.policy, hint.window, hint.reset_after) == ("interval", 10.0, 10.0)
    assert throttle_delay(200, headers, now=NOW) == 10.0


def test_hubspot_spent_day_asks_again_after_an_hour():
    headers = {**HUBSPOT, "X-HubSpot-RateLimit-Daily-Remaining": "0"}
    hint = parse_quota(headers, now=NOW)
    assert (hint.policy, hint.window) == ("daily", 86400.0)
    assert throttle_delay(200, headers, now=NOW) == UNKNOWN_RESET_PROBE_SECONDS


# --- Salesforce: Sforce-Limit-Info --------------------------------------------------------------
# https://developer.salesforce.com/docs/atlas.en-us.api_rest.meta/api_rest/headers_api_usage.htm
# ("api-usage: the daily API usage ... the number of API calls used, and ... the API limit";
# samples "api-usage=18/5000", "api-usage=25/5000; per-app-api-usage=17/250(appName=...)")


def test_salesforce_per_app_quota_is_a_second_dimension():
    headers = {
        "Sforce-Limit-Info": "api-usage=25/5000; "
        "per-app-api-usage=250/250(appName=sample-connected-app)"
    }
    hint = parse_quota(headers, now=NOW)
    assert (hint.policy, hint.remaining) == ("per-app-api-usage", 0)
    assert throttle_delay(200, headers, now=NOW) == UNKNOWN_RESET_PROBE_SECONDS


# --- One sample, one reading: the repeated shapes as tables -----------------------------------
# Each row is a sample as an API above sends it; its id says what it shows. The samples that
# need more than one reading keep a test of their own in their API's section.


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param(
            {"Date": NOW_DATE, "X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "4999",
             "X-RateLimit-Reset": "1700003600", "X-RateLimit-Used": "1",
             "X-RateLimit-Resource": "core"},
            QuotaHint(limit=5000, remaining=4999, reset_after=3600.0, window=None,
                      source="x-ratelimit"),
            id="github-epoch-reset-read-against-server-date",
        ),
        pytest.param(
            # Reddit's headers: a float remaining, no limit, the reset as seconds to go
            {"x-ratelimit-used": "2", "x-ratelimit-remaining": "598.0", "x-ratelimit-reset": "412"},
            QuotaHint(limit=None, remaining=598, reset_after=412.0, window=None,
                      source="x-ratelimit"),
            id="small-reset-is-delta-seconds",
        ),
        pytest.param(
            {"x-rate-limit-limit": "900", "x-rate-limit-remaining": "0",
             "x-rate-limit-reset": "1700000600"},
            QuotaHint(limit=900, remaining=0, reset_after=600.0, window=None,
                      source="x-rate-limit"),
            id="twitter-x-rate-limit-variant",
        ),
        pytest.param(
            {"Date": NOW_DATE, "RateLimit-Limit": "600", "RateLimit-Observed": "67",
             "RateLimit-Remaining": "533", "RateLimit-Reset": "1700000060",
             "RateLimit-ResetTime": "Tue, 14 Nov 2023 22:14:20 GMT"},
            QuotaHint(limit=600, remaining=533, reset_after=60.0, window=None,
                      source="ratelimit-fields"),
            id="gitlab-ratelimit-fields-with-epoch-reset",
        ),
        pytest.param(
            {"RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "30",
             "RateLimit-Policy": "100;w=60"},
            QuotaHint(limit=100, remaining=0, reset_after=30.0, window=60.0,
                      source="ratelimit-fields"),
            id="older-draft-fields-with-delta-reset-and-policy-window",
        ),
        pytest.param(
            {"RateLimit": "limit=100, remaining=0, reset=30",
             "RateLimit-Policy": "10;w=1, 100;w=60"},
            QuotaHint(limit=100, remaining=0, reset_after=30.0, window=60.0,
                      source="ratelimit-dict"),
            id="draft-07-dictionary-with-policy",
        ),
        pytest.param(
            {"ratelimit-policy": '"default";q=1200;w=300', "ratelimit": '"default";r=1199;t=1'},
            QuotaHint(limit=1200, remaining=1199, reset_after=1.0, window=300.0,
                      source="ratelimit", policy="default"),
            id="cloudflare-structured-fields",
        ),
        pytest.param(
            {"RateLimit-Policy": '"burst";q=100;w=60, "daily";q=1000;w=86400',
             "RateLimit": '"burst";r=50;t=30, "daily";r=0;t=3600'},
            QuotaHint(limit=1000, remaining=0, reset_after=3600.0, window=86400.0,
                      source="ratelimit", policy="daily"),
            id="spent-policy-chosen-over-one-with-quota-left",
        ),
        pytest.param(
            {"Sforce-Limit-Info": "api-usage=18/5000"},
            QuotaHint(limit=5000, remaining=4982, reset_after=None, window=86400.0,
                      source="salesforce", policy="api-usage"),
            id="salesforce-daily-usage",
        ),
        # no hint: nothing a dialect can read
        pytest.param({}, None, id="no-headers"),
        pytest.param({"Content-Type": "application/json"}, None, id="no-rate-limit-headers"),
        pytest.param(
            {"X-RateLimit-Limit": "lots", "X-RateLimit-Remaining": "some",
             "X-RateLimit-Reset": "soon"},
            None,
            id="garbage-values",
        ),
        # a trailing comma, which RFC 8941 says fails the whole field
        pytest.param({"RateLimit": '"default";r=0;t=30,'}, None, id="malformed-structured-field"),
        # https://learn.microsoft.com/en-us/answers/questions/5625878/azure-openai-responses-api-x-ratelimit-headers-val
        pytest.param(
            {"x-ratelimit-limit-tokens": "-1", "x-ratelimit-remaining-tokens": "-1",
             "x-ratelimit-reset-tokens": "0"},
            None,
            id="azure-openai-minus-one-means-not-reported-not-spent",
        ),
        *(
            pytest.param({"X-Shopify-Shop-Api-Call-Limit": value}, None,
                         id=f"shopify-malformed-call-limit-{value}")
            for value in ["40", "40/", "/40", "a/40", "39/40/2", "-1/40"]
        ),
        *(
            pytest.param({"Sforce-Limit-Info": value}, None,
                         id=f"salesforce-malformed-usage-{value}")
            for value in ["api-usage=25", "api-usage=a/b", "usage=1/2", ""]
        ),
    ],
)  # fmt: skip
def test_a_sample_gives_its_hint(headers, expected):
    assert parse_quota(headers, now=NOW) == expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        pytest.param(
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000030000"},
            pytest.approx(30.0),
            id="epoch-milliseconds-recognised",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1700000090"},
            90.0,
            id="epoch-without-date-header-uses-our-clock",
        ),
        pytest.param(
            # a server whose clock is 30 s ahead of ours, resetting 60 s after its own now:
            # 60 s, not the 90 s our own clock would make of it
            {"Date": "Tue, 14 Nov 2023 22:13:50 GMT", "X-RateLimit-Remaining": "0",
             "X-RateLimit-Reset": str(int(NOW) + 30 + 60)},
            60.0,
            id="epoch-uses-server-clock-when-it-runs-ahead-of-ours",
        ),
        pytest.param(
            {"Date": "yesterday-ish", "X-RateLimit-Remaining": "0",
             "X-RateLimit-Reset": "1700000090"},
            90.0,
            id="unreadable-date-header-falls-back-to-our-clock",
        ),
        pytest.param(
            {"Date": NOW_DATE, "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1699999990"},
            0.0,
            id="epoch-already-passed-means-no-wait",
        ),
        pytest.param(
            {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "500000000"},
            MAX_DELAY_SECONDS,
            id="absurd-delta-capped-at-a-day",
        ),
        pytest.param(
            # a server 30 s ahead of us whose reset is 12.5 s after its own now, given in +02:00
            {"Date": "Tue, 14 Nov 2023 22:13:50 GMT", "anthropic-ratelimit-tokens-remaining": "0",
             "anthropic-ratelimit-tokens-reset": "2023-11-15T00:14:02.500+02:00"},
            12.5,
            id="anthropic-offset-and-fraction-read-on-the-server-clock",
        ),
        # OpenAI's resets are Go's time.Duration (its guide: 1s, 6m0s)
        *(
            pytest.param(
                {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": value},
                pytest.approx(seconds),
                id=f"openai-duration-{value}",
            )
            for value, seconds in [
                ("1s", 1.0),
                ("6m0s", 360.0),
                ("1m12.5s", 72.5),
                ("20ms", 0.02),
                ("0s", 0.0),
                ("1h2m3s", 3723.0),
                # https://community.openai.com/t/how-to-get-rate-limit-reset-time-for-response-api/1268905
                ("12ms", 0.012),
                # https://console.groq.com/docs/rate-limits (Groq sends OpenAI's headers)
                ("2m59.56s", 179.56),
                ("7.66s", 7.66),
            ]
        ),
        *(
            pytest.param(
                {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": value},
                None,
                id=f"openai-malformed-duration-{value}",
            )
            for value in ["m0s", "1.s", "6m 0s", "5 s", "1d", "-1s", "1sm"]
        ),
        *(
            pytest.param(
                {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": value},
                None,
                id=f"partial-or-invalid-iso-{value}",
            )
            for value in ["2023-11-14", "2023-11-14T", "2023-11-14T22", "2023-11-14T25:00Z",
                          "14/11/2023 22:15"]
        ),
    ],
)  # fmt: skip
def test_a_sample_gives_its_reset(headers, expected):
    assert parse_quota(headers, now=NOW).reset_after == expected


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        *(
            pytest.param(status, {"Retry-After": "4"}, 4.0,
                         id=f"{status}-waits-for-retry-after")
            for status in [429, 503]
        ),
        pytest.param(
            # a server 30 s ahead of us asking for 120 s by its clock
            429,
            {"Date": "Tue, 14 Nov 2023 22:13:50 GMT",
             "Retry-After": "Tue, 14 Nov 2023 22:15:50 GMT"},
            120.0,
            id="retry-after-date-read-on-the-server-clock",
        ),
        pytest.param(
            503, {"Retry-After": "Tue, 14 Nov 2023 22:15:50 GMT"}, 150.0,
            id="retry-after-date-without-date-header-uses-our-clock",
        ),
        pytest.param(
            429,
            {"Retry-After": "30", "RateLimit-Policy": '"default";q=100;w=60',
             "RateLimit": '"default";r=0;t=30'},
            30.0,
            id="ietf-draft-429-example-waits-for-retry-after",
        ),
        pytest.param(
            429, {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"}, 30.0,
            id="429-without-retry-after-waits-for-spent-quota-reset",
        ),
        pytest.param(
            429,
            {"Retry-After": "later", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "30"},
            30.0,
            id="429-with-garbage-retry-after-falls-back-to-quota",
        ),
        # a 429 without hints says nothing: the limiter applies its own default block then
        pytest.param(429, {}, None, id="429-without-hints"),
        pytest.param(429, {"Retry-After": "soon"}, None, id="429-with-garbage-retry-after-only"),
        pytest.param(
            # a 429 asking for 1 s while the hourly quota is spent for another 3600 s
            429,
            {"Retry-After": "1", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "3600"},
            3600.0,
            id="longer-of-retry-after-and-spent-quota-wins",
        ),
        pytest.param(
            200,
            {"Date": NOW_DATE, "X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "0",
             "X-RateLimit-Reset": "1700000045"},
            45.0,
            id="success-with-spent-quota-blocks-before-any-429",
        ),
        pytest.param(
            200, {"X-RateLimit-Remaining": "10", "X-RateLimit-Reset": "30"}, None,
            id="success-with-quota-left-says-nothing",
        ),
        pytest.param(
            200,
            {"Date": NOW_DATE, "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1699999000"},
            None,
            id="success-with-spent-quota-already-reset-says-nothing",
        ),
        pytest.param(
            200, {"X-RateLimit-Remaining": "0"}, None,
            id="spent-quota-without-reset-says-nothing",
        ),
        *(
            pytest.param(status, {"Retry-After": "120"}, None,
                         id=f"retry-after-ignored-on-{status}")
            for status in [200, 201, 301, 404]
        ),
        pytest.param(
            403, {"Retry-After": "60", "X-RateLimit-Remaining": "4000"}, 60.0,
            id="github-secondary-limit-403-waits-for-retry-after",
        ),
        pytest.param(
            403,
            {"Date": NOW_DATE, "X-RateLimit-Limit": "5000", "X-RateLimit-Remaining": "0",
             "X-RateLimit-Reset": "1700001800", "X-RateLimit-Resource": "core"},
            1800.0,
            id="github-primary-limit-403-waits-for-reset",
        ),
        pytest.param(
            200,
            {"RateLimit-Policy": '"burst";q=100;w=60, "daily";q=1000;w=86400',
             "RateLimit": '"burst";r=99;t=59, "daily";r=0;t=7200'},
            7200.0,
            id="success-with-spent-ietf-policy-blocks-until-its-reset",
        ),
        pytest.param(
            429, {"Retry-After": "315360000"}, MAX_DELAY_SECONDS,
            id="absurd-retry-after-blocks-for-at-most-a-day",
        ),
        pytest.param(
            429,
            {**OPENAI_DOC_SAMPLE, "x-ratelimit-remaining-requests": "0",
             "x-ratelimit-remaining-tokens": "0"},
            360.0,
            id="openai-both-dimensions-spent-wait-for-the-later-reset",
        ),
        pytest.param(
            # Anthropic's page: "retry-after: the number of seconds to wait until you can retry
            # the request"; the spent requests reset later
            429,
            {**ANTHROPIC, "retry-after": "20", "anthropic-ratelimit-requests-remaining": "0",
             "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:50Z"},
            30.0,
            id="anthropic-429-waits-for-the-longer-of-retry-after-and-the-spent-reset",
        ),
        pytest.param(
            429, {"X-Shopify-Shop-Api-Call-Limit": "40/40", "Retry-After": "2.0"}, 2.0,
            id="shopify-429-waits-for-retry-after",
        ),
        pytest.param(
            200,
            {"X-Ratelimit-Used": "599", "X-Ratelimit-Remaining": "0.6", "X-Ratelimit-Reset": "5"},
            5.0,
            id="reddit-fraction-of-a-request-left-is-none-left",
        ),
        pytest.param(
            429,
            {"Retry-After": "65", "X-RateLimit-Global": "true", "X-RateLimit-Scope": "global"},
            65.0,
            id="discord-documented-global-429-blocks-for-retry-after",
        ),
        pytest.param(
            # the OAuth changelog: OAuth calls get the burst headers, not the daily ones
            200,
            {"X-HubSpot-RateLimit-Interval-Milliseconds": "10000",
             "X-HubSpot-RateLimit-Max": "110", "X-HubSpot-RateLimit-Remaining": "0"},
            10.0,
            id="hubspot-oauth-headers-have-no-daily-limit",
        ),
        # no header says when Salesforce's rolling day frees calls again: ask after an hour
        *(
            pytest.param(200, {"Sforce-Limit-Info": value}, UNKNOWN_RESET_PROBE_SECONDS,
                         id=f"salesforce-spent-day-{value}")
            for value in ["api-usage=15000/15000", "api-usage=15020/15000"]
        ),
    ],
)  # fmt: skip
def test_a_response_gives_its_wait(status, headers, expected):
    assert throttle_delay(status, headers, now=NOW) == expected


# --- Hostile values: a header the parser cannot use is ignored, never an error -----------------

# Past int()'s limit of 4300 digits: int() of it raises, float() of it is inf.
HUGE = "9" * 5000


def _spent(source: Source, policy: str | None = None) -> QuotaHint:
    """A spent quota that says nothing usable about its limit or reset."""
    return QuotaHint(
        limit=None, remaining=0, reset_after=None, window=None, source=source, policy=policy
    )


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Sforce-Limit-Info": f"api-usage={HUGE}/5"}, None),
        ({"Sforce-Limit-Info": f"api-usage=5/{HUGE}"}, None),
        ({"Sforce-Limit-Info": f"api-usage=1/{'9' * 400}"}, None),  # a float cannot hold it
        ({"X-Shopify-Shop-Api-Call-Limit": f"{HUGE}/40"}, None),
        ({"X-Shopify-Shop-Api-Call-Limit": f"{'9' * 400}/40"}, None),
        ({"X-RateLimit-Remaining": "1" * (MAX_DIGITS + 1)}, None),
        ({"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": HUGE}, _spent("x-ratelimit")),
        (
            {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": f"{HUGE}s"},
            _spent("openai", "tokens"),
        ),
        (
            {"X-HubSpot-RateLimit-Interval-Milliseconds": HUGE, "X-HubSpot-RateLimit-Max": HUGE,
             "X-HubSpot-RateLimit-Remaining": "0"},
            _spent("hubspot", "interval"),
        ),
    ],
)  # fmt: skip
def test_a_number_longer_than_any_count_is_ignored(headers, expected):
    assert parse_quota(headers, now=NOW) == expected
    assert throttle_delay(200, headers, now=NOW) is None


@pytest.mark.parametrize(
    "unusable",
    [
        {"X-Shopify-Shop-Api-Call-Limit": f"{HUGE}/40"},
        {"Sforce-Limit-Info": f"api-usage={HUGE}/5"},
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1e999"},
    ],
)
def test_a_429_with_an_unusable_header_still_waits_for_retry_after(unusable):
    assert throttle_delay(429, {**unusable, "Retry-After": "7"}, now=NOW) == 7.0
    assert throttle_delay(429, unusable, now=NOW) is None  # the caller's default backoff


@pytest.mark.parametrize("value", [HUGE, "1" * (MAX_DIGITS + 1), f"1.{HUGE}", f"-{HUGE}"])
def test_retry_after_longer_than_any_count_is_ignored(value):
    assert parse_retry_after(value, now=NOW) is None


def test_the_longest_counts_read_are_read():
    # given: counts of MAX_DIGITS digits, the longest read
    longest = "1" * MAX_DIGITS
    headers = {"X-Shopify-Shop-Api-Call-Limit": f"{longest}/{longest}"}
    assert parse_quota(headers, now=NOW).limit == int(longest)
    assert parse_retry_after(longest, now=NOW) == MAX_DELAY_SECONDS


# Each dialect's fields with the shapes its values take ({} a number), as a server would send
# them all at once.
_HTTP_DATES = ["Tue, 14 Nov {} 22:13:20 GMT", "Tue, {} Nov 2023 {}:13:20 +{}"]
_ISO_DATES = ["{}-11-14T22:13:20Z", "2023-11-14T22:13:20.{}+{}:00"]
_RESETS = ["{}", *_ISO_DATES, *_HTTP_DATES]
DIALECTS: dict[str, dict[str, list[str]]] = {
    "retry-after": {"Retry-After": ["{}", *_HTTP_DATES], "Date": _HTTP_DATES},
    "ratelimit": {
        "RateLimit": ['"p";r={};t={}', "limit={}, remaining={}, reset={}"],
        "RateLimit-Policy": ['"p";q={};w={}', "{};w={}"],
        "Date": _HTTP_DATES,
    },
    "ratelimit-fields": {
        "RateLimit-Limit": ["{}", "{}, {};w={}"],
        "RateLimit-Remaining": ["{}"],
        "RateLimit-Reset": _RESETS,
    },
    "x-ratelimit": {
        "X-RateLimit-Limit": ["{}"],
        "X-RateLimit-Remaining": ["{}"],
        "X-RateLimit-Reset": _RESETS,
        "Date": _HTTP_DATES,
    },
    "x-rate-limit": {
        "X-Rate-Limit-Limit": ["{}"],
        "X-Rate-Limit-Remaining": ["{}"],
        "X-Rate-Limit-Reset": _RESETS,
    },
    "discord": {
        "X-RateLimit-Remaining": ["{}"],
        "X-RateLimit-Reset-After": ["{}"],
        "X-RateLimit-Global": ["true"],
        "X-RateLimit-Scope": ["user", "shared"],
        "Retry-After": ["{}"],
    },
    "openai": {
        "x-ratelimit-limit-tokens": ["{}"],
        "x-ratelimit-remaining-tokens": ["{}"],
        "x-ratelimit-reset-tokens": ["{}h{}m{}s", "{}ms", "{}"],
    },
    "anthropic": {
        "anthropic-ratelimit-tokens-limit": ["{}"],
        "anthropic-ratelimit-tokens-remaining": ["{}"],
        "anthropic-ratelimit-tokens-reset": _ISO_DATES,
        "Date": _HTTP_DATES,
    },
    "shopify": {"X-Shopify-Shop-Api-Call-Limit": ["{}/{}"], "Retry-After": ["{}"]},
    "hubspot": {
        "X-HubSpot-RateLimit-Interval-Milliseconds": ["{}"],
        "X-HubSpot-RateLimit-Max": ["{}"],
        "X-HubSpot-RateLimit-Remaining": ["{}"],
        "X-HubSpot-RateLimit-Daily": ["{}"],
        "X-HubSpot-RateLimit-Daily-Remaining": ["{}"],
        "X-HubSpot-RateLimit-Secondly-Remaining": ["{}"],
    },
    "salesforce": {
        "Sforce-Limit-Info": ["api-usage={}/{}", "api-usage={}/{}; per-app-api-usage={}/{}(a=b)"],
        "Retry-After": ["{}"],
    },
}
# Runs of digits around the lengths that matter: a 64-bit count's 20, a float's 309, int()'s
# limit of 4300.
_DIGITS = st.one_of(
    st.integers(0, 10**25).map(str),
    st.builds(str.__mul__, st.sampled_from("19"), st.sampled_from([21, 309, 400, 4300, 4301])),
)
_NUMBERS = st.one_of(
    _DIGITS,
    _DIGITS,  # twice as likely as any of the rest
    st.builds("-{}".format, _DIGITS),
    st.builds("{}.{}".format, _DIGITS, _DIGITS),
    # float() reads all of these; int() reads the last (Arabic-Indic digits)
    st.sampled_from(["inf", "-inf", "nan", "NaN", "1e999", "-1e999", "1e-999", "1_0", "٣"]),
)


@st.composite
def header_value(draw: st.DrawFn, shapes: list[str]) -> str:
    """One of the field's shapes with numbers of any length and kind in it, or any text."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.text(st.characters(max_codepoint=0x6FF), max_size=80))
    shape = draw(st.sampled_from(shapes))
    return shape.format(*(draw(_NUMBERS) for _ in range(shape.count("{}"))))


def _usable_seconds(value: float | None) -> bool:
    return value is None or 0 <= value <= MAX_DELAY_SECONDS


def _usable_count(value: int | None) -> bool:
    # a count any arithmetic on it can take: a whole number >= 0 that fits in a float
    return value is None or (isinstance(value, int) and value >= 0 and math.isfinite(float(value)))


@pytest.mark.parametrize("dialect", DIALECTS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_no_header_value_of_any_dialect_raises_or_gives_an_unusable_number(dialect, data):
    headers = {
        name: data.draw(header_value(shapes), label=name)
        for name, shapes in DIALECTS[dialect].items()
    }
    hint = parse_quota(headers, now=NOW)
    if hint is not None:
        assert _usable_count(hint.limit) and _usable_count(hint.remaining)
        assert _usable_seconds(hint.reset_after)
        assert hint.window is None or (math.isfinite(hint.window) and hint.window >= 0)
    for status in (200, 403, 429, 503):
        assert _usable_seconds(throttle_delay(status, headers, now=NOW))
    for value in headers.values():
        assert _usable_seconds(parse_retry_after(value, now=NOW))
        # the cost reader, from a header and from a number in a JSON body
        body = b'{"usage": {"tokens": %s}}' % value.encode()
        for cost_headers in ({"X-Cost": value}, {}):
            cost = cost_from_response(
                cost_headers, body, header="X-Cost", json_field="usage.tokens"
            )
            assert cost is None or 0 <= cost <= MAX_COST


# --- Responses that name no rate-limit field -----------------------------------------------------


@pytest.mark.parametrize(
    "field",
    [
        "Retry-After",
        "RateLimit",
        "RateLimit-Policy",
        "RateLimit-Remaining",
        "X-RateLimit-Remaining",
        "X-Rate-Limit-Remaining",
        "X-RateLimit-Remaining-Tokens",
        "anthropic-ratelimit-requests-remaining",
        "X-Shopify-Shop-Api-Call-Limit",
        "X-HubSpot-RateLimit-Remaining",
        "Sforce-Limit-Info",
    ],
)
def test_every_family_field_passes_the_quick_test_for_hints(field):
    # throttle_delay and parse_quota answer None at once for a response without such a field
    assert headers_module._may_hint(normalise({field: "1"}))


def test_a_response_naming_no_rate_limit_field_says_nothing():
    plain = {"Date": "Wed, 21 Oct 2015 07:28:00 GMT", "Content-Type": "text/plain", "Server": "x"}
    assert throttle_delay(429, plain, now=0.0) is None
    assert parse_quota(plain, now=0.0) is None
