"""The adaptive rate learns an API's real limit and holds just under it: a 600-call run
from several threads through the real limiter against the sandbox, which enforces 40 % of the
rate it advertises."""

from __future__ import annotations

import pytest

from ratejobs.limiter import Limiter, LimiterConfig
from ratejobs.sandbox.drive import drive

# The sandbox advertises CONFIGURED requests/s (the API's published rate, which the limiter is
# configured with) and enforces REAL; 600 calls at REAL take 10 s, so the test stays short.
CONFIGURED, REAL = 150.0, 60.0
SERVER_BURST = 5
CALLS = 600
THREADS = 4
# The steady part: the second half of the calls. Discovery (about four throttles from 150/s
# down, each blocking everyone for the 1 s Retry-After) is over well before call 300.
STEADY_FROM = CALLS // 2

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
    steady = result.pace(STEADY_FROM) / REAL
    print(
        f"learned {state.learned_rate:.2f}/s (real {REAL:g}/s), holding at "
        f"{state.current_rate:.2f}/s; {CALLS} calls in {result.seconds:.1f} s "
        f"({result.pace() / REAL:.1%} of the real limit overall, {steady:.1%} over the second "
        f"half); {result.throttled} 429s ({result.throttled_share:.1%}), "
        f"{state.counts.decreases} decreases"
    )
    # expect: the learned limit close to the real one, few 429s, and the steady part using at
    # least 90 % of the real limit (about 97 % alone; CI saw 94.9 % with another test process
    # beside it on 2 cores: the client's threads, not the limiter, fell behind; make
    # bench-adaptive measures the figure, this guards the behaviour)
    assert result.calls == CALLS
    assert stats["throttled"] == result.throttled
    assert state.learned_rate == pytest.approx(REAL, rel=0.04)
    assert result.throttled_share <= 0.02
    assert steady >= 0.90
    assert state.current_rate <= REAL
