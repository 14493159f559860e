"""The adaptive rate learns an API's real limit and holds just under it: runs from several threads
through the real limiter against the sandbox, which enforces less than the rate it advertises."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from ratejobs.limiter import Limiter, LimiterConfig
from sandbox.drive import drive

# The sandbox advertises CONFIGURED requests/s (the API's published rate, which the limiter is
# configured with) and enforces REAL; 600 calls at REAL take 10 s, so the test stays short.
CONFIGURED, REAL = 150.0, 60.0
SERVER_BURST = 5
CALLS = 600
THREADS = 4
# The steady part: the calls after the last throttle. Discovery (about four throttles from
# 150/s down, each blocking everyone for the 1 s Retry-After) ended after 180-360 of the 600
# successes in six runs, as the timing of the first throttles fell: measured from a fixed call
# 300, a run whose last throttle came after it counted that throttle's block too (83 % where
# the others measured 99 %). At least STEADY_CALLS come after it.
STEADY_CALLS = CALLS // 3

pytestmark = pytest.mark.paced


def test_adaptive_rate_learns_the_real_limit_and_holds_just_under_it(
    make_limiter, redis_client, sandbox
):
    # given an API advertising 150/s that enforces 60/s (sending Retry-After, no quota headers),
    # and an adaptive limiter configured at the advertised rate
    server = sandbox(rate=CONFIGURED, real_rate=REAL, burst=SERVER_BURST, headers="none")
    limiter = make_limiter(LimiterConfig(rate=CONFIGURED, burst=1, adaptive=True))
    # when four threads send 600 calls through it, each 429 fed back and sent again
    result = drive(
        lambda: Limiter(redis_client, limiter.name), server.url, calls=CALLS, threads=THREADS
    )
    state, stats = limiter.state(), server.stats()
    steady_calls = result.after_last_throttle()
    # from the first success after the last throttle's block to the end
    steady = result.pace(result.calls - steady_calls + 1) / REAL
    print(
        f"learned {state.learned_rate:.2f}/s (real {REAL:g}/s), holding at "
        f"{state.current_rate:.2f}/s; {CALLS} calls in {result.seconds:.1f} s "
        f"({result.pace() / REAL:.1%} of the real limit overall, {steady:.1%} over the "
        f"{steady_calls} after the last 429); {result.throttled} 429s "
        f"({result.throttled_share:.1%}), "
        f"{state.counts.decreases} decreases"
    )
    # expect: the learned limit close to the real one, few 429s, and the steady part using at
    # least 90 % of the real limit (about 97 % alone; CI saw 94.9 % with another test process
    # beside it on 2 cores: the client's threads, not the limiter, fell behind; make
    # bench-adaptive measures the figure, this guards the behaviour)
    assert result.calls == CALLS
    assert stats["throttled"] == result.throttled
    assert state.learned_rate == pytest.approx(REAL, rel=0.03)
    assert result.throttled_share <= 0.02
    assert steady_calls >= STEADY_CALLS
    assert steady >= 0.90
    assert state.current_rate <= REAL


def test_the_limit_is_found_in_a_few_throttles_and_within_three_per_cent(
    make_limiter, redis_client, sandbox
):
    # given an API advertising 25/s that enforces 10/s with a burst of 5 (Retry-After 1 s on a
    # 429), and a new adaptive limiter at the advertised rate
    real = 10.0
    server = sandbox(rate=25.0, real_rate=real, burst=SERVER_BURST, headers="none")
    limiter = make_limiter(LimiterConfig(rate=25.0, burst=1, adaptive=True))
    calls = 400
    result = drive(lambda: Limiter(redis_client, limiter.name), server.url, calls=calls, threads=4)
    state = limiter.state()
    print(
        f"learned {state.learned_rate:.3f}/s of a real {real:g}/s after "
        f"{state.counts.decreases} cuts; {result.pace() / real:.1%} of it overall, "
        f"{result.throttled} 429s ({result.throttled_share:.1%})"
    )
    # expect: the span before the first throttle is a measurement (the API's bucket was full),
    # so the throttles that find the limit are four: the first, one cut no deeper than CUBIC's,
    # a rough estimate, and the gentle climb from it that makes it sure; one more for the
    # probe or a late answer. Each costs every thread the server's Retry-After.
    assert result.calls == calls
    assert state.counts.decreases <= 5
    assert state.learned_rate == pytest.approx(real, rel=0.03)
    assert result.throttled_share <= 0.02


def test_after_an_idle_spell_sending_starts_just_under_the_learned_limit(
    make_limiter, redis_client, sandbox
):
    # given an adaptive limiter configured at the advertised 150/s that learned the real
    # 60/s from the 429s of a first job
    server = sandbox(rate=CONFIGURED, real_rate=REAL, burst=SERVER_BURST, headers="none")
    config = LimiterConfig(rate=CONFIGURED, burst=1, adaptive=True)
    limiter = make_limiter(config)
    drive(lambda: Limiter(redis_client, limiter.name), server.url, calls=CALLS, threads=THREADS)
    learned = limiter.state().learned_rate
    assert learned == pytest.approx(REAL, rel=0.03)
    # and then a trickle for 3 s (a call every 0.3 s: the API is never idle), through which the
    # probe climbs above what was learned, as it may while traffic flows (recovery_seconds cut
    # to 0.5 s from the default 20 s so that it shows within the test)
    limiter.configure(replace(config, recovery_seconds=0.5, version=2))
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        limiter.acquire()
        time.sleep(0.3)
    probing = limiter.state().current_rate
    assert probing > 1.05 * learned
    # when the API then sits idle past the recovery time and a whole period
    time.sleep(1.5)
    idle = limiter.state().current_rate
    # expect: the idle rate is back just under the learned limit (where it holds while busy),
    # not at the probe's, and the next job's grants are spaced at it
    assert idle == pytest.approx(0.99 * learned, rel=1e-6)
    first, _, third = limiter.acquire(), limiter.acquire(), limiter.acquire()
    assert third.slot_us - first.slot_us >= 2 * 1_000_000 / learned
    assert limiter.state().current_rate < learned
