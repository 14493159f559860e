"""Signatures of job callbacks (ratejobs.signing), the verifier of docs/api.md, and the retry
rules of a delivery (pure functions: no server, no database)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import random
import re
import time
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ratejobs.execution.http import HttpResult
from ratejobs.services.callbacks import attempt_verdict, retry_delay
from ratejobs.signing import SECRET_PREFIX, new_secret, signature_header, verify

SECRET = "rjwhsec_test-secret"
BODY = b'{"event":"job.finished","job":{"id":1}}'
NOW = 1_800_000_000


def test_the_signature_is_hmac_sha256_of_the_time_a_dot_and_the_body():
    header = signature_header(SECRET, BODY, NOW)
    expected = hmac.new(SECRET.encode(), f"{NOW}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert header == f"t={NOW},v1={expected}"


def test_a_signature_verifies_with_its_secret_body_and_time():
    assert verify(SECRET, BODY, signature_header(SECRET, BODY, NOW), now=NOW + 10)


@pytest.mark.parametrize(
    "secret, body, sent_at, now",
    [
        ("rjwhsec_another", BODY, NOW, NOW),  # another key
        (SECRET, BODY + b" ", NOW, NOW),  # a body changed by one byte
        (SECRET, BODY, NOW, NOW + 301),  # replayed after the tolerance
        (SECRET, BODY, NOW, NOW - 301),  # from a clock far ahead
    ],
)
def test_a_signature_fails_for_another_key_body_or_a_time_out_of_tolerance(
    secret, body, sent_at, now
):
    assert not verify(secret, body, signature_header(SECRET, BODY, sent_at), now=now)


def test_the_time_is_signed_so_it_cannot_be_moved_to_replay_a_delivery():
    # given an old delivery's signature with its t replaced by a fresh one
    old = signature_header(SECRET, BODY, NOW - 3600)
    forged = re.sub(r"t=\d+", f"t={NOW}", old)
    assert not verify(SECRET, BODY, forged, now=NOW)


@pytest.mark.parametrize("header", [None, "", "v1=abc", f"t={NOW}", "t=soon,v1=abc", "garbage"])
def test_a_missing_or_malformed_header_does_not_verify(header):
    assert not verify(SECRET, BODY, header, now=NOW)


def test_other_schemes_beside_v1_are_ignored():
    header = signature_header(SECRET, BODY, NOW) + ",v0=deadbeef"
    assert verify(SECRET, BODY, header, now=NOW)


def test_secrets_are_new_each_time_and_long():
    first, second = new_secret(), new_secret()
    assert first != second
    assert first.startswith(SECRET_PREFIX) and len(first) >= len(SECRET_PREFIX) + 40


@functools.cache
def _documented_verifier():
    """The verify() of docs/api.md's "Job callbacks" section, run as a receiver would."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    section = page.split("\n## Job callbacks\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/api.md", "exec"), namespace)  # noqa: S102 - our own docs
    return namespace["verify"]


def test_the_documented_verifier_accepts_our_signatures_and_refuses_tampering():
    documented_verify = _documented_verifier()
    now = int(time.time())
    assert documented_verify(SECRET, BODY, signature_header(SECRET, BODY, now))
    assert not documented_verify(SECRET, BODY + b"x", signature_header(SECRET, BODY, now))
    assert not documented_verify("other", BODY, signature_header(SECRET, BODY, now))
    assert not documented_verify(SECRET, BODY, signature_header(SECRET, BODY, now - 3600))


# -- whatever a forger sends, both verifiers answer False ------------------------------------

# Characters str.isdigit() takes for digits that are not 0-9: "²" (int() refuses it), "١"
# (int() reads it), "①"...
NON_ASCII_DIGITS = st.characters(categories=["Nd", "No"], exclude_characters="0123456789")
NAMES = st.sampled_from(["t", "v1", " t ", "v1 ", "v0", "T", "", "t\x00"]) | st.text(max_size=4)
VALUES = st.one_of(
    st.text(),
    st.text(NON_ASCII_DIGITS, min_size=1, max_size=12),
    st.text("0123456789", min_size=13, max_size=6000),  # past a float, past int()'s 4,300
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
    st.text("0123456789abcdef", max_size=80),  # hex of the wrong length, or not ours
    st.binary(max_size=80).map(lambda raw: raw.decode("latin-1")),
)
PARTS = st.lists(st.builds("{}={}".format, NAMES, VALUES) | st.text(max_size=8), max_size=30)
MALFORMED = st.one_of(
    st.text(),
    PARTS.map(",".join),
    st.integers(min_value=0, max_value=5000).map(lambda n: "," * n),
    st.binary(max_size=200).map(lambda raw: raw.decode("latin-1")),
    st.binary(max_size=200).map(lambda raw: raw.decode("utf-8", "surrogateescape")),
    st.binary(max_size=200),  # not even text
    # a real signature with one character of it replaced by anything
    st.tuples(st.integers(min_value=0, max_value=200), st.characters()).map(
        lambda at: _corrupted(signature_header(SECRET, BODY, NOW), *at)
    ),
)


def _corrupted(header: str, at: int, char: str) -> str:
    """`header` with its character at `at` (modulo its length) changed to `char`, or to a NUL
    when it is `char` already."""
    at %= len(header)
    return header[:at] + (char if char != header[at] else "\x00") + header[at + 1 :]


@pytest.mark.slow
@hypothesis_settings(max_examples=400, deadline=None, database=None)
@given(header=MALFORMED)
@example(header=f"t=²,v1={'0' * 64}")  # isdigit(), then int() raised ValueError
@example(header=f"t={NOW},v1=é")  # compare_digest() raised TypeError
@example(header="t=" + "9" * 400 + ",v1=ab")  # the clock arithmetic raised OverflowError
@example(header="t=" + "9" * 5000 + ",v1=ab")  # int() of 5,000 digits raised ValueError
@example(header=signature_header(SECRET, BODY, NOW).replace(str(NOW), "١٨٠٠٠٠٠٠٠٠"))
def test_any_malformed_header_is_refused_by_both_verifiers_and_never_raises(header):
    # given the header of a forger (whatever the receiver's framework hands over): False, so
    # the receiver answers 401, never 500
    assert verify(SECRET, BODY, header, now=NOW) is False
    assert _documented_verifier()(SECRET, BODY, header) is False


@hypothesis_settings(max_examples=200, deadline=None, database=None)
@given(
    secret=st.text(min_size=1),
    body=st.binary(),
    skew=st.integers(min_value=-290, max_value=290),
    others=st.lists(st.sampled_from(["v0=deadbeef", "x=1", " v2=abc", "future=a=b"]), max_size=3),
)
def test_valid_headers_still_verify_with_both_verifiers(secret, body, skew, others):
    now = int(time.time())
    header = ",".join([signature_header(secret, body, now + skew), *others])
    assert verify(secret, body, header, now=now)
    assert _documented_verifier()(secret, body, header)


# -- what an attempt's result means --------------------------------------------------------


@pytest.mark.parametrize(
    "result, kind",
    [
        (HttpResult(status_code=200), "delivered"),
        (HttpResult(status_code=204), "delivered"),
        (HttpResult(status_code=500), "retry"),
        (HttpResult(status_code=503), "retry"),
        (HttpResult(status_code=429), "retry"),
        (HttpResult(status_code=408), "retry"),
        (HttpResult(status_code=None, error_kind="connect", error="refused"), "retry"),
        (HttpResult(status_code=None, error_kind="timeout", error="slow"), "retry"),
        (HttpResult(status_code=400), "failed"),
        (HttpResult(status_code=401), "failed"),
        (HttpResult(status_code=404), "failed"),
        (HttpResult(status_code=410), "failed"),
        (HttpResult(status_code=None, error_kind="refused", error="not allowed"), "failed"),
    ],
)
def test_2xx_delivers_network_errors_5xx_408_and_429_retry_other_answers_fail(result, kind):
    assert attempt_verdict(result, now=NOW).kind == kind


def test_a_429_carries_its_retry_after():
    result = HttpResult(status_code=429, headers={"Retry-After": "120"})
    assert attempt_verdict(result, now=NOW).retry_after == 120


def test_the_backoff_grows_with_jitter_between_half_and_all_of_its_ceiling():
    random.seed(7)
    for attempt, ceiling in [(1, 30), (2, 60), (3, 120), (4, 240), (5, 480), (6, 900), (8, 900)]:
        delays = [retry_delay(attempt, base=30, cap=900, retry_after=None) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), attempt
        assert len(set(delays)) > 100  # jittered, not in lockstep


def test_the_backoff_waits_at_least_retry_after_however_long_past_the_cap():
    # the delivery's deadline bounds a Retry-After (tests/jobs/test_callbacks.py), not the cap
    assert retry_delay(1, base=30, cap=900, retry_after=600) == 600
    assert retry_delay(1, base=30, cap=900, retry_after=7200) == 7200
    assert 15 <= retry_delay(1, base=30, cap=900, retry_after=1) <= 30


def test_the_default_schedule_spends_under_an_hour_over_eight_attempts():
    # given the defaults (8 attempts, base 30 s, cap 900 s): 7 waits between them
    from django.conf import settings

    longest = sum(
        min(
            settings.RATEJOBS_CALLBACK_BACKOFF_CAP,
            settings.RATEJOBS_CALLBACK_BACKOFF_BASE * 2 ** (n - 1),
        )
        for n in range(1, settings.RATEJOBS_CALLBACK_MAX_ATTEMPTS)
    )
    assert 20 * 60 < longest < 60 * 60
    # and the default deadline leaves room for all of it, the attempts' own time included
    attempts = settings.RATEJOBS_CALLBACK_MAX_ATTEMPTS * settings.RATEJOBS_CALLBACK_TIMEOUT
    assert longest + attempts <= settings.RATEJOBS_CALLBACK_DEADLINE_SECONDS
