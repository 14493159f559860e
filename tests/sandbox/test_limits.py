"""Several buckets on one request (extra windows, a token budget) and their config, without HTTP."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox.bucket import NS_PER_S, Bucket, Limits
from sandbox.config import SandboxConfig, parse_argv, parse_quota_spec
from sandbox.state import worst_sum_in_window

MS = 1_000_000
START = 1_000 * NS_PER_S


def test_window_spec_burst_defaults_to_the_whole_rate_rounded_down():
    config, _ = parse_argv(["--window", "300/60", "--window", "2.5/1", "--window", "10/2/3"])
    assert config.windows == ((300.0, 60.0, 300), (2.5, 1.0, 2), (10.0, 2.0, 3))


def test_token_budget_spec_sets_rate_period_and_burst():
    config, _ = parse_argv(["--token-budget", "1000/60"])
    assert (config.token_rate, config.token_period, config.token_burst) == (1000.0, 60.0, None)
    assert config.effective_token_burst == 1000
    config, _ = parse_argv(["--token-budget", "1000/60/200"])
    assert config.effective_token_burst == 200
    assert SandboxConfig().effective_token_burst == 0  # no budget


@pytest.mark.parametrize("spec", ["300", "300/", "a/60", "300/0", "-1/60", "300/60/0", "1/1/2.5"])
def test_malformed_quota_specs_are_refused(spec):
    with pytest.raises(ValueError, match="RATE|positive|number"):
        parse_quota_spec(spec)
    with pytest.raises(SystemExit):
        parse_argv(["--window", spec])


def test_windows_and_token_budget_survive_the_command_line():
    config = SandboxConfig(windows=[[300, 60], (10, 2, 3)], token_rate=50, token_period=1.5)
    again, _ = parse_argv(config.to_argv())
    assert again == config
    assert again.windows == ((300.0, 60.0, 300), (10.0, 2.0, 3))


def test_live_changes_take_windows_as_json_lists_and_turn_the_budget_off():
    config = SandboxConfig(token_rate=10, token_period=1)
    changed = config.with_changes({"windows": [[5, 1], [2, 10, 1]], "token_rate": None})
    assert changed.windows == ((5.0, 1.0, 5), (2.0, 10.0, 1))
    assert changed.token_rate is None
    assert changed.with_changes({"windows": []}).windows == ()
    assert config.with_changes({"windows": ((1, 10),)}).windows == ((1.0, 10.0, 1),)  # Python


@pytest.mark.parametrize(
    "changes",
    [
        {"windows": [[0, 1]]},
        {"windows": [[1, 1, 0]]},
        {"windows": [[1, 1, True]]},
        {"windows": [[1, 1, 1.5]]},
        {"windows": [[1]]},
        {"windows": [["1", 1]]},
        {"windows": "1/1"},
        {"windows": [[1, 1, 1, 1]]},
        {"token_rate": 5, "token_period": None},
        {"token_rate": -5, "token_period": 1},
        {"token_burst": 0},
        {"token_period": 0},
    ],
)
def test_live_changes_refuse_bad_windows_and_budgets(changes):
    with pytest.raises(ValueError):
        SandboxConfig().with_changes(changes)


def test_bucket_takes_a_cost_only_when_all_of_it_fits():
    # given 10 tokens per second with a burst of 10
    bucket = Bucket(rate=10, period=1, burst=10)
    assert bucket.take(START, 6)
    assert bucket.wait_ns(START, 5) == 100 * MS  # one token short: one interval
    assert not bucket.take(START, 5)
    assert bucket.remaining(START) == 4  # the refusal took nothing
    assert bucket.take(START, 4)
    assert bucket.wait_ns(START, 11) is None  # more than the burst: never
    assert bucket.wait_ns(START, 0) == 0


def test_a_window_refuses_with_its_own_wait_and_charges_no_bucket():
    # given 100/s burst 10, and a window of 2 per 10 s (burst 2)
    limits = Limits(SandboxConfig(rate=100, burst=10, windows=((2, 10, 2),)))
    assert [limits.decide(START).admitted for _ in range(2)] == [True, True]
    main_before = limits.enforced.tat_ns
    refused = limits.decide(START)
    # expect: the window refused, asking for its next slot (5 s), not the main bucket's 0
    assert (refused.admitted, refused.cause, refused.wait) == (False, "window:0", 5.0)
    assert limits.enforced.tat_ns == main_before  # no partial charge
    # ... and the headers' tightest quota is the window's
    tightest = refused.tightest
    assert (tightest.name, tightest.limit, tightest.period, tightest.remaining) == (
        "window:0",
        2,
        10,
        0,
    )


def test_retry_after_waits_for_every_bucket_and_names_the_slowest():
    # given a main bucket of 1/s burst 1, and a window of 1 per 3 s
    limits = Limits(SandboxConfig(rate=1, burst=1, windows=((1, 3, 1),)))
    assert limits.decide(START).admitted
    refused = limits.decide(START + 500 * MS)
    # both refuse; the window's 2.5 s is when the request fits both
    assert (refused.cause, refused.wait) == ("window:0", 2.5)
    assert not limits.decide(START + 1_000 * MS).admitted  # main would, the window not yet
    assert limits.decide(START + 3_000 * MS).admitted


def test_token_budget_admits_by_the_tokens_asked_for():
    # given 100 tokens per 10 s (10/s) with the whole 100 at once, and a loose request limit
    limits = Limits(SandboxConfig(rate=1000, burst=100, token_rate=100, token_period=10))
    assert limits.decide(START, 60).admitted
    refused = limits.decide(START, 50)
    assert (refused.admitted, refused.cause, refused.wait) == (False, "tokens", 1.0)
    assert refused.tokens is not None and refused.tokens.remaining == 40
    admitted = limits.decide(START, 40)
    assert admitted.admitted and admitted.tokens is not None
    assert (admitted.tokens.remaining, admitted.tokens.reset_after) == (0, 10.0)
    # a request of more tokens than the burst never fits: refused with no wait to give
    assert (limits.decide(START + 20 * NS_PER_S, 101).wait, limits.tokens.burst) == (None, 100)


def test_no_limit_refuses_nothing_and_leaves_the_enforced_buckets_alone():
    limits = Limits(SandboxConfig(rate=1, burst=1, no_limit=True, windows=((1, 60, 1),)))
    assert all(limits.decide(START).admitted for _ in range(5))
    assert limits.windows[0].remaining(START) == 1
    assert limits.decide(START).requests[0].remaining == 0  # the advertised quota counts down


def test_live_windows_keep_their_debt_and_new_ones_start_full():
    limits = Limits(SandboxConfig(rate=100, burst=10, windows=((1, 10, 1),)))
    assert limits.decide(START).admitted
    config = SandboxConfig(rate=100, burst=10, windows=((1, 10, 1), (5, 1, 5)))
    limits.configure(config, now_ns=START)
    refused = limits.decide(START)
    assert refused.cause == "window:0"
    assert refused.requests[2].remaining == 5
    limits.configure(SandboxConfig(rate=100, burst=10), now_ns=START)
    assert limits.decide(START).admitted


@settings(max_examples=100, deadline=None)
@given(
    token_rate=st.integers(1, 100),
    token_burst=st.integers(1, 30),
    window_rate=st.integers(1, 20),
    arrivals=st.lists(
        st.tuples(st.integers(0, 30 * MS), st.integers(0, 35)), min_size=1, max_size=50
    ),
)
def test_every_bucket_keeps_its_window_bound_under_any_arrivals(
    token_rate, token_burst, window_rate, arrivals
):
    # given a main bucket, a window and a token budget, and requests of any size at any time
    config = SandboxConfig(
        rate=50,
        burst=5,
        windows=((window_rate, 0.5, 2),),
        token_rate=token_rate,
        token_period=1,
        token_burst=token_burst,
    )
    limits = Limits(config)
    now, admitted = START, []
    for gap, tokens in arrivals:
        now += gap
        if limits.decide(now, tokens).admitted:
            admitted.append((now, tokens))
    # expect: units in every [a_i, a_j] <= burst + width * rate / period, exactly, for each
    for rate, period, burst, weight in (
        (50, 1, 5, lambda tokens: 1),
        (window_rate, Fraction(1, 2), 2, lambda tokens: 1),
        (token_rate, 1, token_burst, lambda tokens: tokens),
    ):
        for i in range(len(admitted)):
            units = 0
            for j in range(i, len(admitted)):
                units += weight(admitted[j][1])
                width = Fraction(admitted[j][0] - admitted[i][0], NS_PER_S)
                assert units <= burst + width * rate / period


@given(
    points=st.lists(st.tuples(st.integers(0, 5_000), st.integers(0, 9)), max_size=40).map(sorted),
    window=st.integers(1, 2_000),
)
def test_worst_sum_in_window_matches_brute_force(points, window):
    times = [t for t, _ in points]
    expected = max(
        (sum(w for t, w in points if start <= t < start + window) for start in times), default=0
    )
    assert worst_sum_in_window(times, [w for _, w in points], window) == expected
