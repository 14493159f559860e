"""`make demo`: the whole system on one machine, until Ctrl-C.

Starts (or finds) Redis, the sandbox API with a real limit below the one it advertises, the web
server, two Celery workers, beat and Flower; creates an admin user, an adaptive API for the
sandbox and a demo job of 500 calls; prints where to look; follows the job; and on Ctrl-C stops
every process it started. A second run reuses the database, the admin user (and its password)
and the API.

Ports and addresses come from the environment: WEB_HOST, WEB_PORT, FLOWER_PORT, SANDBOX_PORT,
REDIS_URL, DATABASE_URL, DEMO_CALLS; DEMO_RUN_DIR (logs and the admin password, default .run/);
DEMO_EXIT_WHEN_DONE=1 stops everything once the demo job is done.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

from devtools import devredis  # noqa: E402 (after the path is set)
from devtools.processes import stop_process_group  # noqa: E402
from sandbox.process import SandboxProcess, start_sandbox_process  # noqa: E402

RUN_DIR = Path(os.environ.get("DEMO_RUN_DIR", PROJECT_ROOT / ".run"))
LOG_DIR = RUN_DIR / "logs"
PASSWORD_FILE = RUN_DIR / "demo-admin-password"
ADMIN_USER = "admin"
API_NAME = "sandbox"
# The sandbox advertises ADVERTISED_RATE but enforces REAL_RATE: the adaptive limiter meets
# 429s, blocks every worker for their Retry-After, cuts its rate and settles near the real one.
ADVERTISED_RATE = 20.0
REAL_RATE = 12.0
STOP_TIMEOUT = 20.0
PROGRESS_EVERY = 5.0
# How often the job and the children are looked at between progress lines.
CHECK_EVERY = 0.5
READY_TIMEOUT = 90.0


class Demo:
    def __init__(self) -> None:
        # This machine only by default: the demo's admin password is printed on the screen.
        self.web_host = os.environ.get("WEB_HOST", "127.0.0.1")
        self.web_port = int(os.environ.get("WEB_PORT", "8000"))
        self.flower_port = int(os.environ.get("FLOWER_PORT", "5555"))
        self.sandbox_port = int(os.environ.get("SANDBOX_PORT", "8081"))
        self.calls = int(os.environ.get("DEMO_CALLS", "500"))
        self.exit_when_done = os.environ.get("DEMO_EXIT_WHEN_DONE") == "1"
        self.redis: devredis.RedisServer | None = None
        self.sandbox: SandboxProcess | None = None
        self.children: list[tuple[str, subprocess.Popen]] = []

    @property
    def browse_host(self) -> str:
        # compares with the all-interfaces addresses to print a browsable one; binds nothing
        return "localhost" if self.web_host in ("0.0.0.0", "::") else self.web_host  # noqa: S104

    def run(self) -> int:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        give_back_the_terminal = take_the_terminal()
        try:
            self.start_services()
            job_id = self.set_up_data()
            self.start_processes()
            self.print_addresses()
            return self.follow(job_id)
        except KeyboardInterrupt:
            print("\nstopping...")
            return 0  # Ctrl-C is how a demo ends: not an error
        finally:
            self.stop()
            give_back_the_terminal()

    # -- starting ---------------------------------------------------------------------------

    def start_services(self) -> None:
        # the broker, the cache and the limiter all follow a private Redis (the processes
        # started below inherit this environment)
        self.redis = devredis.ensure_for_environment(os.environ)
        where = "private, started for the demo" if self.redis.started_here else "found running"
        print(f"Redis:   {self.redis.url} ({where})")
        os.environ.update(
            DJANGO_SETTINGS_MODULE=os.environ.get(
                "DJANGO_SETTINGS_MODULE", "project.settings.base"
            ),
            RATEJOBS_FLOWER_URL=f"http://{self.browse_host}:{self.flower_port}/",
            # The sandbox listens on loopback, which the outbound policy refuses by default.
            RATEJOBS_OUTBOUND_ALLOW=os.environ.get(
                "RATEJOBS_OUTBOUND_ALLOW", "127.0.0.1/32,::1/128"
            ),
            # bound to this machine (WEB_HOST), so anyone who can reach it may read them
            RATEJOBS_METRICS_PUBLIC=os.environ.get("RATEJOBS_METRICS_PUBLIC", "true"),
        )
        self.sandbox = start_sandbox_process(
            port=self.sandbox_port,
            rate=ADVERTISED_RATE,
            real_rate=REAL_RATE,
            burst=5,
            headers="none",
        )
        print(
            f"Sandbox: {self.sandbox.url} (advertises {ADVERTISED_RATE:g}/s, "
            f"enforces {REAL_RATE:g}/s)"
        )
        subprocess.run(
            [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
            cwd=PROJECT_ROOT,
            check=True,
        )

    def set_up_data(self) -> int:
        import django

        django.setup()
        from django.contrib.auth import get_user_model

        from ratejobs.models import Api
        from ratejobs.services.apis import api_create, api_update
        from ratejobs.services.jobs import job_create

        admin, created = get_user_model().objects.get_or_create(
            username=ADMIN_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        if created or not PASSWORD_FILE.exists():
            password = secrets.token_urlsafe(12)
            admin.set_password(password)
            admin.save()
            PASSWORD_FILE.write_text(password)
            PASSWORD_FILE.chmod(0o600)
        self.password = PASSWORD_FILE.read_text().strip()

        limits = {
            "base_url": self.sandbox.url,
            "rate": ADVERTISED_RATE,
            "burst": 2,
            "adaptive": True,
            "min_rate": 2.0,
        }
        # On a second run the sandbox may listen elsewhere; the limits go back to the demo's.
        api = Api.objects.filter(name=API_NAME).first()
        api = api_create(name=API_NAME, **limits) if api is None else api_update(api=api, **limits)
        job = job_create(
            owner=admin,
            api=api,
            name=f"demo: {self.calls} calls",
            calls=({"method": "GET", "path": f"/items/{i}"} for i in range(self.calls)),
        )
        print(f"Demo job #{job.pk}: {job.total} calls to API {api.name!r}")
        return job.pk

    def start_processes(self) -> None:
        py = sys.executable
        celery = [py, "-m", "celery", "-A", "project"]
        self.spawn(
            "web",
            [py, "manage.py", "runserver", "--noreload", f"{self.web_host}:{self.web_port}"],
        )
        for n in (1, 2):
            self.spawn(
                f"worker{n}",
                [*celery, "worker", "-n", f"demo{n}@%h", "--concurrency=2", "-l", "INFO"],
            )
        self.spawn(
            "beat",
            [*celery, "beat", "-l", "INFO", "-s", str(RUN_DIR / "celerybeat-schedule"),
             "--pidfile="],
        )  # fmt: skip
        self.spawn(
            "flower",
            [*celery, "flower", f"--port={self.flower_port}", f"--address={self.web_host}"],
        )
        self.wait_until_web_answers()

    def spawn(self, name: str, argv: list[str]) -> None:
        log = (LOG_DIR / f"{name}.log").open("ab")
        # Its own session: Ctrl-C reaches only this script, which stops the children in order.
        process = subprocess.Popen(
            argv, cwd=PROJECT_ROOT, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.children.append((name, process))

    def wait_until_web_answers(self) -> None:
        import urllib.request

        deadline = time.monotonic() + READY_TIMEOUT
        url = f"http://127.0.0.1:{self.web_port}/admin/login/"
        while time.monotonic() < deadline:
            self.check_children()
            try:
                with urllib.request.urlopen(url, timeout=2):
                    return
            except OSError:
                time.sleep(0.5)
        raise SystemExit(f"the web server did not answer at {url}; see {LOG_DIR / 'web.log'}")

    def print_addresses(self) -> None:
        base = f"http://{self.browse_host}:{self.web_port}"
        print(
            "\n"
            f"  Admin:     {base}/admin/   user {ADMIN_USER!r}, password {self.password!r}\n"
            f"  API docs:  {base}/api/docs/\n"
            f"  Flower:    http://{self.browse_host}:{self.flower_port}/\n"
            f"  Metrics:   {base}/metrics\n"
            f"  Logs:      {LOG_DIR}/\n"
            "\nCtrl-C stops everything this started.\n",
            flush=True,
        )

    # -- running ----------------------------------------------------------------------------

    def follow(self, job_id: int) -> int:
        """Print the demo job's progress until it is done; then wait for Ctrl-C."""
        from ratejobs.models import Job

        final = False
        printed_at = -PROGRESS_EVERY
        while True:
            self.check_children()
            if not final:
                job = Job.objects.get(pk=job_id)
                final = job.status in (Job.Status.COMPLETED, Job.Status.CANCELLED)
                # The end is printed as soon as it comes; progress every PROGRESS_EVERY s.
                if final or time.monotonic() - printed_at >= PROGRESS_EVERY:
                    printed_at = time.monotonic()
                    print(
                        f"demo job: {job.done}/{job.total} done, {job.succeeded} ok, "
                        f"{job.throttled} 429s, {job.retries} retries ({job.status})",
                        flush=True,
                    )
                if final and self.exit_when_done:
                    return 0
                if final:
                    print("The demo job is done; the system keeps running until Ctrl-C.")
            time.sleep(CHECK_EVERY)

    def check_children(self) -> None:
        for name, process in self.children:
            if process.poll() is not None:
                raise SystemExit(
                    f"{name} exited with status {process.returncode}; "
                    f"see {LOG_DIR / (name + '.log')}"
                )

    def stop(self) -> None:
        # Web and Flower first, then workers (a warm shutdown finishes their current calls).
        try:
            for name, process in reversed(self.children):
                stop_process_group(process, STOP_TIMEOUT)
                print(f"stopped {name}")
        except KeyboardInterrupt:
            # A second Ctrl-C (or SIGTERM) while the workers finish their calls: no more
            # waiting, but nothing left running (it used to leave the workers behind).
            print("\nstopping at once...")
            for _, process in self.children:
                stop_process_group(process, 0)
        if self.sandbox is not None:
            self.sandbox.stop()
        if self.redis is not None and self.redis.started_here:
            self.redis.stop()
            print("stopped the private Redis")


def take_the_terminal() -> Callable[[], None]:
    """Make this process's own group the terminal's foreground one, so that Ctrl-C reaches the
    demo alone; return what gives the terminal back.

    Under `make demo`, Ctrl-C would reach make too, and GNU make ends on SIGINT whatever its
    recipe does ("make: *** [Makefile:23: demo] Interrupt", status 130). In its own group the
    demo stops its children and exits 0, and make ends with it, quietly."""
    try:
        terminal = sys.stdin.fileno()
        if not os.isatty(terminal):
            return lambda: None
        before = os.tcgetpgrp(terminal)
        os.setpgid(0, 0)  # already its group's leader when a shell started it: nothing changes
        # A process outside the foreground group that sets it is sent SIGTTOU (stop) otherwise.
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        os.tcsetpgrp(terminal, os.getpgrp())
    except (OSError, ValueError):  # no terminal, or a session leader: leave things as they are
        return lambda: None

    def give_back() -> None:
        with contextlib.suppress(OSError):
            os.tcsetpgrp(terminal, before)

    return give_back


def main() -> int:
    # SIGTERM (from a test or a process manager) stops as cleanly as Ctrl-C.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    # Started in the background by a shell, it would inherit SIGINT ignored: Ctrl-C must work.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return Demo().run()


if __name__ == "__main__":
    sys.exit(main())
