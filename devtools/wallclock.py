"""Processes whose wall clock is off (bench/scale's hosts, tests' workers): wallclock.c built
into a preload library, and a check that a Python process under it sees the offset on its wall
clock and none on its monotonic one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SOURCE = Path(__file__).with_name("wallclock.c")
OFFSET_VARIABLE = "RJS_WALL_CLOCK_OFFSET"
# The check's own timings: a process under the library must see its offset within this much
# (the time to start it is in between), and finish a timed lock wait and a sleep of PROBE_WAIT
# within PROBE_WAIT_SLACK of it.
OFFSET_TOLERANCE = 2.0
PROBE_WAIT = 0.2
PROBE_WAIT_SLACK = 1.0
PROBE = f"""
import json, threading, time
wall, mono = time.time(), time.monotonic()
threading.Event().wait({PROBE_WAIT})
time.sleep({PROBE_WAIT})
print(json.dumps({{"wall": wall, "waited": time.monotonic() - mono}}))
"""


class ClockError(RuntimeError):
    pass


def build(directory: Path) -> Path:
    """The preload library, compiled from wallclock.c into `directory`."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise ClockError("no C compiler (cc, gcc) to build the wall-clock library")
    library = directory / "libwallclock.so"
    done = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(library), str(SOURCE), "-ldl"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode:
        raise ClockError(f"building {SOURCE.name} failed: {done.stderr.strip()}")
    return library


def environment(library: Path, offset: float) -> dict[str, str]:
    """What a process's environment needs for its wall clock to be `offset` seconds off."""
    if not offset:
        return {}
    return {"LD_PRELOAD": str(library), OFFSET_VARIABLE: repr(offset)}


def check(library: Path, offset: float, prefix: Sequence[str] = ()) -> float:
    """Runs a Python process under the library (after `prefix`, e.g. on a host) and returns the
    offset it saw; ClockError unless its wall clock is `offset` off and its waits are on time."""
    env = {"PATH": os.environ.get("PATH", os.defpath), **environment(library, offset)}
    before = time.time()
    done = subprocess.run(
        [*prefix, sys.executable, "-c", PROBE],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    if done.returncode:
        raise ClockError(f"the clock probe failed: {done.stderr.strip()[-500:]}")
    seen = json.loads(done.stdout)
    skew = seen["wall"] - before
    if abs(skew - offset) > OFFSET_TOLERANCE:
        raise ClockError(f"wanted a wall clock {offset:+g} s off, the probe saw {skew:+.1f} s")
    if not 2 * PROBE_WAIT <= seen["waited"] <= 2 * PROBE_WAIT + PROBE_WAIT_SLACK:
        raise ClockError(
            f"a timed wait and a sleep of {PROBE_WAIT:g} s each took {seen['waited']:.2f} s "
            "under the wall-clock library"
        )
    return skew
