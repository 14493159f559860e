"""--limit-by-header: each value of a header (a customer's credential) has buckets of its own."""

from __future__ import annotations

import hashlib

import pytest

from sandbox.config import SandboxConfig, parse_argv


def _digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()[:16]


def test_each_authorization_value_gets_its_own_burst_and_429s_stay_with_it(make_sandbox, session):
    # given burst 3 at 1/s per Authorization value, and 3 values each sending 5 at once
    sandbox = make_sandbox(rate=1, burst=3, limit_by_header="Authorization")
    for key in ("a", "b", "c"):
        statuses = [
            session.get(sandbox.url + "/x", headers={"Authorization": f"Bearer {key}"}).status_code
            for _ in range(5)
        ]
        # expect: each value gets its whole burst, then 429s, whatever the others did
        assert statuses == [200, 200, 200, 429, 429], key
    stats = sandbox.stats(detail=True)
    assert stats["ok"] == 9 and stats["throttled"] == 6
    assert set(stats["buckets"]) == {_digest(f"Bearer {key}") for key in "abc"}
    assert all(b == {"arrivals": 5, "throttled": 2, "worst_window_admitted": 3}
               for b in stats["buckets"].values())  # fmt: skip
    # the credential itself is never shown, only its digest
    assert "Bearer" not in str(stats)


def test_without_the_option_every_request_shares_one_bucket(make_sandbox, session):
    sandbox = make_sandbox(rate=1, burst=3)
    statuses = [
        session.get(sandbox.url + "/x", headers={"Authorization": f"k{i}"}).status_code
        for i in range(4)
    ]
    assert statuses == [200, 200, 200, 429]
    assert sandbox.stats()["buckets"] == {}


def test_the_flag_round_trips_and_refuses_a_bad_header_name():
    config, _ = parse_argv(["--limit-by-header", "Authorization"])
    assert config.limit_by_header == "Authorization"
    assert parse_argv(config.to_argv())[0] == config
    with pytest.raises(ValueError, match="limit_by_header"):
        SandboxConfig(limit_by_header="Bad Header")
