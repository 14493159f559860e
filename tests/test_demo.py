"""`make demo` as a user runs it: everything starts, the demo job runs through the sandbox's
real limit, Flower's HTTP API shows the workers and the finished call tasks, Ctrl-C stops every
process, and a second run reuses what the first made."""

from __future__ import annotations

import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests

from devtools import devredis
from devtools.devredis import free_port

PROJECT_ROOT = Path(__file__).resolve().parents[1]
DEMO_CALLS = 40
pytestmark = [pytest.mark.timeout(300), pytest.mark.e2e]  # the demo starts two workers and beat


class DemoRun:
    """scripts/demo.py in its own session, its output read line by line."""

    def __init__(self, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "scripts/demo.py"], cwd=PROJECT_ROOT, env=env, text=True,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, pattern: str, timeout: float) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            self.output.append(line)
            if match := re.search(pattern, line):
                return match
        raise AssertionError(f"no {pattern!r} in the demo's output:\n{''.join(self.output)}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # what Ctrl-C sends
        return self.process.wait(60)

    def end(self) -> None:
        """Whatever happened, leave no process behind: the demo stops its children itself
        (they run in their own sessions), so ask it first and kill it only if it hangs."""
        try:
            self.stop()
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


CALLS_ARG = re.compile(r"calls=(\d+)")


def demo_api_id(session: requests.Session, web: int) -> str:
    """The demo API's id, as the submit page offers it."""
    page = session.get(f"http://127.0.0.1:{web}/admin/ratejobs/job/add/", timeout=10).text
    return re.search(r'<option value="(\d+)"[^>]*>sandbox</option>', page).group(1)


def poll(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if result := check():
                return result
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_make_demo_starts_everything_and_ctrl_c_stops_it(tmp_path):
    web, flower, sandbox = free_port(), free_port(), free_port()
    # as on a fresh machine: no Redis where the environment says, so the demo starts its own
    # and the broker, the cache and the limiter all follow it
    dead_redis = f"redis://127.0.0.1:{free_port()}/0"
    env = {
        **os.environ,
        "WEB_HOST": "127.0.0.1",
        "WEB_PORT": str(web),
        "FLOWER_PORT": str(flower),
        "SANDBOX_PORT": str(sandbox),
        "DEMO_CALLS": str(DEMO_CALLS),
        "DEMO_RUN_DIR": str(tmp_path / "run"),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "REDIS_URL": dead_redis,
        "CELERY_BROKER_URL": dead_redis,
        "RATEJOBS_CACHE_URL": dead_redis,
        "DJANGO_SETTINGS_MODULE": "project.settings.base",
        # Flower's HTTP API answers only with auth configured, or with this set (tests only).
        "FLOWER_UNAUTHENTICATED_API": "true",
    }
    demo = DemoRun(env)
    try:
        private_redis = demo.wait_for(r"Redis: +(\S+) \(private, started for the demo\)",
                                      timeout=60).group(1)  # fmt: skip
        password = demo.wait_for(r"password '([^']+)'", timeout=120).group(1)
        demo.wait_for("Ctrl-C stops everything", timeout=30)
        flower_url = f"http://127.0.0.1:{flower}"

        # Flower sees both workers...
        def demo_workers() -> list[str]:
            answer = requests.get(f"{flower_url}/api/workers", params={"refresh": 1}, timeout=10)
            names = [name for name in answer.json() if name.startswith(("demo1@", "demo2@"))]
            return names if len(names) == 2 else []

        assert len(poll(demo_workers, timeout=60, what="both workers in Flower")) == 2

        # ...the demo job runs to completion through the sandbox's real limit...
        demo.wait_for(rf"{DEMO_CALLS}/{DEMO_CALLS} done.*\(completed\)", timeout=120)

        # ...and Flower shows its finished call tasks with readable arguments
        def finished_calls() -> list[dict]:
            tasks = requests.get(
                f"{flower_url}/api/tasks",
                params={"taskname": "ratejobs.execute_calls", "state": "SUCCESS"},
                timeout=5,
            ).json()
            carried = sum(
                int(m.group(1)) for t in tasks.values() if (m := CALLS_ARG.search(t["args"]))
            )
            return list(tasks.values()) if carried >= DEMO_CALLS else []

        # (a message carries several calls of one job: Flower shows the job and how many)
        tasks = poll(finished_calls, timeout=30, what="finished call tasks in Flower")
        assert all(
            re.fullmatch(r"\(job=\d+, calls=\d+, first=\d+\)", task["args"]) for task in tasks
        )

        # the web server answers: the admin with the printed password, the metrics
        session = requests.Session()
        login = f"http://127.0.0.1:{web}/admin/login/"
        session.get(login, timeout=10)
        page = session.post(
            login,
            data={"username": "admin", "password": password, "next": "/admin/",
                  "csrfmiddlewaretoken": session.cookies["csrftoken"]},
            timeout=10,
        )  # fmt: skip
        assert page.url.endswith("/admin/") and "Flower" in page.text
        # the submit page keeps a refused file in the cache, which is the private Redis too
        submit_url = f"http://127.0.0.1:{web}/admin/ratejobs/job/add/"
        refused = session.post(
            submit_url,
            data={"api": demo_api_id(session, web), "name": "bad", "priority": "1",
                  "csrfmiddlewaretoken": session.cookies["csrftoken"]},
            files={"calls_file": ("calls.csv", b"path,cost\n/a,-1\n")},
            headers={"Referer": submit_url},
            timeout=10,
        )  # fmt: skip
        assert refused.status_code == 200, refused.text[-2000:]
        assert "line 2: cost:" in refused.text
        assert "Using <strong>calls.csv</strong>" in refused.text
        metrics = requests.get(f"http://127.0.0.1:{web}/metrics", timeout=10).text
        assert 'ratejobs_limiter_grants_total{api="sandbox"}' in metrics
        assert 'ratejobs_calls{api="sandbox",status="succeeded"} 40.0' in metrics

        # Ctrl-C stops every process the demo started
        assert demo.stop() == 0  # Ctrl-C is how a demo ends: not an error
        for port in (web, flower, sandbox):
            assert not listening(port), port
        assert not devredis.answers(private_redis)
    finally:
        demo.end()

    # a second run reuses the database, the admin and its password, and the API
    again = DemoRun({**env, "DEMO_CALLS": "5", "DEMO_EXIT_WHEN_DONE": "1"})
    try:
        assert again.wait_for(r"password '([^']+)'", timeout=120).group(1) == password
        again.wait_for(r"5/5 done.*\(completed\)", timeout=120)
        assert again.process.wait(60) == 0
    finally:
        again.end()
