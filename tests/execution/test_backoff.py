"""Full jitter: uniform between zero and an exponential ceiling that stops at the cap."""

from __future__ import annotations

import random

import pytest

from ratejobs.execution import backoff_ceiling, full_jitter


@pytest.mark.parametrize(
    ("attempt", "ceiling"), [(0, 0.5), (1, 1.0), (2, 2.0), (3, 4.0), (6, 10.0), (5000, 10.0)]
)
def test_ceiling_doubles_per_attempt_up_to_the_cap(attempt, ceiling):
    assert backoff_ceiling(attempt, base=0.5, cap=10.0) == ceiling


@pytest.mark.parametrize("attempt", [0, 1, 3, 10, 100, 5000])
def test_full_jitter_stays_between_zero_and_the_ceiling(attempt):
    rng = random.Random(attempt)
    ceiling = backoff_ceiling(attempt, base=0.5, cap=10.0)
    draws = [full_jitter(attempt, base=0.5, cap=10.0, rng=rng) for _ in range(2000)]
    assert all(0.0 <= d <= ceiling for d in draws)
    # spread over the whole window, not bunched at one end
    assert min(draws) < ceiling * 0.05 and max(draws) > ceiling * 0.95


def test_full_jitter_is_reproducible_with_a_seeded_rng():
    first = [full_jitter(3, base=1, cap=60, rng=random.Random(7)) for _ in range(3)]
    second = [full_jitter(3, base=1, cap=60, rng=random.Random(7)) for _ in range(3)]
    assert first == second


@pytest.mark.parametrize(
    "kwargs",
    [
        {"attempt": -1, "base": 1, "cap": 1},
        {"attempt": 1.5, "base": 1, "cap": 1},
        {"attempt": 0, "base": -1, "cap": 1},
        {"attempt": 0, "base": 1, "cap": float("inf")},
    ],
)
def test_nonsense_arguments_are_refused(kwargs):
    with pytest.raises(ValueError):
        full_jitter(kwargs.pop("attempt"), **kwargs)
