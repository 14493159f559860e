"""PgBouncer on the services host in transaction pooling mode, between every process of the
hosts and PostgreSQL; the database URL that reaches it, and a restart."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from devtools import devredis

# Django over transaction pooling: no server-side cursors (a cursor lives in a session, and
# the next transaction may run on another server connection). django-environ reads it from the
# URL's query; Django itself already turns psycopg 3's prepared statements off
# (prepare_threshold=None), which PgBouncer before 1.21 cannot keep.
URL_OPTIONS = "disable_server_side_cursors=True"
# Server connections per database and user: the worker hosts' 2 × (2 pool processes + the
# main one), beat, gunicorn's 2 and the run, with room; the clients may be many more.
POOL_SIZE = 20
MAX_CLIENTS = 500
START_TIMEOUT = 20.0
STOP_TIMEOUT = 10.0
CONFIG = """[databases]
* = host={pg_host} port={pg_port}

[pgbouncer]
listen_addr = {address}
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory}/userlist.txt
pool_mode = transaction
default_pool_size = {pool_size}
max_client_conn = {max_clients}
server_reset_query =
ignore_startup_parameters = extra_float_digits,options
logfile = {directory}/pgbouncer.log
pidfile = {directory}/pgbouncer.pid
admin_users = postgres
"""


class PgBouncerError(RuntimeError):
    pass


class PgBouncer:
    """Started at once, stopped with `stop()`; as root, it runs as the postgres user (it
    refuses root, as PostgreSQL does)."""

    def __init__(self, address: str, pg_host: str, pg_port: int, root: Path) -> None:
        binary = shutil.which("pgbouncer")
        if binary is None:
            raise PgBouncerError("no pgbouncer on PATH (apt-get install pgbouncer)")
        self.binary, self.address = binary, address
        self.port = devredis.free_port()
        self.root = root
        self.config = self.root / "pgbouncer.ini"
        self.config.write_text(
            CONFIG.format(
                pg_host=pg_host, pg_port=pg_port, address=address, port=self.port,
                directory=self.root, pool_size=POOL_SIZE, max_clients=MAX_CLIENTS,
            )
        )  # fmt: skip
        (self.root / "userlist.txt").write_text('"postgres" ""\n')
        self._user: str | None = None
        if os.geteuid() == 0:
            user = pwd.getpwnam("postgres")
            self._user = user.pw_name
            for path in (self.root, *self.root.iterdir()):
                os.chown(path, user.pw_uid, user.pw_gid)
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def log(self) -> Path:
        return self.root / "pgbouncer.log"

    def url(self, database_url: str) -> str:
        """`database_url` (PostgreSQL's) through PgBouncer: its database and user, this host
        and port, and the options transaction pooling needs."""
        parts = urlsplit(database_url)
        user = f"{parts.username}@" if parts.username else ""
        query = "&".join(filter(None, [parts.query, URL_OPTIONS]))
        return urlunsplit(
            (parts.scheme, f"{user}{self.address}:{self.port}", parts.path, query, "")
        )

    def clients(self) -> int:
        """Client connections PgBouncer holds now (its admin console's SHOW CLIENTS), this
        question's own left out."""
        import psycopg

        with psycopg.connect(
            host=self.address, port=self.port, user="postgres", dbname="pgbouncer",
            autocommit=True, prepare_threshold=None,
        ) as connection:  # fmt: skip
            return len(connection.execute("SHOW CLIENTS").fetchall()) - 1

    def version(self) -> str:
        done = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        return done.stdout.splitlines()[0].strip() if done.stdout else "PgBouncer"

    def start(self) -> None:
        argv = [self.binary, *(["-u", self._user] if self._user else []), str(self.config)]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.address, self.port), timeout=1),
            ):
                return
            if self.process.poll() is not None or time.monotonic() > deadline:
                tail = self.log.read_text(errors="replace")[-1500:] if self.log.exists() else ""
                raise PgBouncerError(f"pgbouncer did not start:\n{tail}")
            time.sleep(0.1)

    def restart(self) -> float:
        """SIGTERM (PgBouncer's immediate shutdown: every client and server connection
        dropped), then a new one on the same port; the seconds until it listens again."""
        began = time.monotonic()
        self.stop()
        self.start()
        return time.monotonic() - began

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
