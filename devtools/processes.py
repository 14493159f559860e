"""Child processes the project starts and must stop cleanly: workers, beat, servers; and
whether they run under CI, where every check must run."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Mapping

# How CI (and anyone who wants its strictness) says so: CI=true, or 1 or yes, in any case.
_CI_TRUE = frozenset({"1", "true", "yes"})


def ci_requires_every_check(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the CI variable is set: a test or a chaos row that would skip fails instead,
    so CI cannot go green by skipping."""
    return environ.get("CI", "").strip().lower() in _CI_TRUE


def stop_process_group(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM to the process's whole group (a Celery pool's children too), a warm shutdown;
    SIGKILL when it has not ended after `timeout` seconds. The process must have been started
    with `start_new_session=True`, so that its group is its own."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def child_pids(pid: int) -> list[int]:
    """The live direct children of `pid` (a Celery prefork pool's processes), read from /proc
    rather than from a `ps` found on PATH."""
    return sorted(entry for entry, fields in _processes() if int(fields[1]) == pid)


def group_pids(pgid: int) -> list[int]:
    """The running processes of process group `pgid`, zombies left out: what is left of a
    group whose leader was killed (a Celery worker's orphaned pool processes)."""
    return sorted(
        entry for entry, fields in _processes() if int(fields[2]) == pgid and fields[0] != b"Z"
    )


def _processes() -> Iterator[tuple[int, list[bytes]]]:
    """Every process's pid and the fields of its /proc/<pid>/stat after the command name
    (state, ppid, pgrp, ...)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:  # it ended while we looked
            continue
        yield int(entry), fields
