"""Child processes the project starts and must stop cleanly: workers, beat, servers."""

from __future__ import annotations

import os
import signal
import subprocess


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
