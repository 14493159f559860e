"""Run a sandbox as its own process (`python -m sandbox`), out of the test's GIL."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from sandbox.config import SandboxConfig

# The first line `python -m sandbox` prints, once it is listening.
READY_PREFIX = "sandbox listening on "
# An interpreter starts and binds in well under a second; a loaded CI machine gets slack.
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 5.0
HTTP_TIMEOUT_S = 10.0
# The directory holding the ratejobs package, so the child imports the same code.
_PROJECT_ROOT = Path(__file__).resolve().parents[1]
# Control calls go straight to the sandbox, whatever proxy the environment names.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SandboxProcess:
    """A sandbox running in a child process; `stop()` ends it. The child also exits when this
    process dies, since it watches the pipe on its standard input."""

    def __init__(self, url: str, process: subprocess.Popen[bytes]) -> None:
        self.url = url
        self.process = process
        self._finalizer = weakref.finalize(self, _end, process)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def stats(self, *, window: float | None = None, detail: bool = False) -> dict[str, Any]:
        query = {}
        if window is not None:
            query["window"] = repr(window)
        if detail:
            query["detail"] = "1"
        return self._call("GET", "/__stats" + (f"?{urlencode(query)}" if query else ""))

    def reset(self) -> None:
        self._call("POST", "/__reset")

    def most_in_flight(self) -> int:
        """The most requests the sandbox held open at once since its last reset: each arrival
        is open for at least the configured latency (the lower bound when there is one)."""
        stats = self.stats(detail=True)
        arrivals = sorted(entry["t"] for entry in stats["log"])
        return worst_window(arrivals, stats["config"]["latency"])

    def configure(self, **changes: Any) -> dict[str, Any]:
        return self._call("POST", "/__config", changes)

    def stop(self) -> None:
        self._finalizer()

    def _call(self, method: str, path: str, payload: Any = None) -> dict[str, Any]:
        data = None if payload is None else json.dumps(payload).encode()
        # self.url is the sandbox's own http:// URL on loopback, never one a user gave (S310)
        url = self.url + path
        request = urllib.request.Request(url, data=data, method=method)  # noqa: S310
        request.add_header("Content-Type", "application/json")
        with _OPENER.open(request, timeout=HTTP_TIMEOUT_S) as response:
            return json.loads(response.read())

    def __enter__(self) -> SandboxProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_sandbox_process(*, timeout: float = START_TIMEOUT_S, **options: Any) -> SandboxProcess:
    """Start `python -m sandbox` on a free port with SandboxConfig `options` and return
    once it answers."""
    config = SandboxConfig(**options)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PROJECT_ROOT), env.get("PYTHONPATH")]))
    process = subprocess.Popen(
        [sys.executable, "-m", "sandbox", *config.to_argv(), "--stop-on-stdin-close"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    try:
        url = _read_url(process, time.monotonic() + timeout)
        handle = SandboxProcess(url, process)
        handle.stats()  # listening is not yet answering: make sure
    except BaseException:
        _end(process)
        raise
    return handle


def _read_url(process: subprocess.Popen[bytes], deadline: float) -> str:
    if process.stdout is None:
        raise RuntimeError("the sandbox process was started without a stdout pipe")
    fd, line = process.stdout.fileno(), b""
    while not line.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            raise RuntimeError("the sandbox process did not say where it listens in time")
        ready, _, _ = select.select([fd], [], [], min(left, 0.1))
        if ready:
            chunk = os.read(fd, 1)  # one byte at a time: nothing else is read from this pipe
            if not chunk:
                raise RuntimeError(
                    f"the sandbox process exited ({process.wait()}) before listening"
                )
            line += chunk
    text = line.decode().strip()
    if not text.startswith(READY_PREFIX):
        raise RuntimeError(f"unexpected first line from the sandbox process: {text!r}")
    return text.removeprefix(READY_PREFIX)


def _end(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()


def worst_window(sorted_times: Sequence[float], width: float) -> int:
    """Most timestamps in any half-open window [t, t + width)."""
    best = lo = 0
    for hi, t in enumerate(sorted_times):
        while sorted_times[lo] <= t - width:
            lo += 1
        best = max(best, hi - lo + 1)
    return best
