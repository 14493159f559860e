"""The sandbox as a child process: the CLI, start_sandbox_process, and a clean stop."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from ratejobs.limiter.headers import parse_quota
from sandbox import SandboxConfig, start_sandbox_process
from sandbox.config import DEFAULT_CLI_PORT, parse_argv


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_process_serves_until_stopped_and_leaves_nothing_behind(session):
    sandbox = start_sandbox_process(rate=1, burst=2, headers="ietf")
    try:
        assert sandbox.url.startswith("http://127.0.0.1:")
        responses = [session.get(sandbox.url + "/x") for _ in range(3)]
        assert [r.status_code for r in responses] == [200, 200, 429]
        assert parse_quota(responses[0].headers, now=time.time()).limit == 1
        stats = sandbox.stats(window=0.5, detail=True)
        assert (stats["arrivals"], stats["throttled"], len(stats["log"])) == (3, 1, 3)
        assert stats["allowed"] == 2 + 0.5
        assert sandbox.configure(no_limit=True)["no_limit"] is True
        sandbox.reset()
        assert sandbox.stats()["arrivals"] == 0
        assert session.get(sandbox.url + "/x").status_code == 200
    finally:
        sandbox.stop()
    # expect: a clean exit on SIGTERM, reaped, nothing listening
    assert sandbox.process.returncode == 0
    assert gone(sandbox.pid)
    sandbox.stop()  # twice is harmless


def test_process_exits_when_its_parent_goes_away():
    # given a sandbox whose standard input (held by its parent) closes, as when the parent dies
    sandbox = start_sandbox_process()
    try:
        sandbox.process.stdin.close()
        assert sandbox.process.wait(10) == 0
    finally:
        sandbox.stop()


def test_process_start_fails_loudly_on_a_port_in_use():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="exited"):
            start_sandbox_process(port=port)


def test_cli_prints_where_it_listens_first():
    process = subprocess.Popen(
        [sys.executable, "-m", "sandbox", "--port", "0", "--rate", "3"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("sandbox listening on http://127.0.0.1:")
        assert int(line.rsplit(":", 1)[1]) > 0
    finally:
        process.terminate()
        assert process.wait(10) == 0
        process.stdout.close()


def test_cli_flags_round_trip_every_config_field():
    config = SandboxConfig(
        rate=12.5,
        burst=3,
        period=2.0,
        real_rate=7.0,
        no_limit=True,
        retry_after=False,
        retry_after_format="date",
        headers="ietf",
        latency=0.01,
        error_rate=0.1,
        seed=9,
        host="127.0.0.1",
        port=8123,
        max_log=100,
        idempotency_header="X-Dedup",
        max_idempotency_keys=10,
    )
    assert parse_argv(config.to_argv())[0] == config
    off = SandboxConfig(idempotency_header="")
    assert parse_argv(off.to_argv())[0] == off
    assert parse_argv([])[0] == SandboxConfig(port=DEFAULT_CLI_PORT)


def test_cli_rejects_a_config_that_makes_no_sense(capsys):
    with pytest.raises(SystemExit):
        parse_argv(["--rate", "0"])
    assert "rate must be a positive number" in capsys.readouterr().err
