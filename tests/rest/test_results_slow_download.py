"""A results download read slowly from a real gunicorn: between pages the server's session
holds no transaction (PostgreSQL's pg_stat_activity), the worker's memory does not follow the
file, and every call comes once, in index order, while calls change during the download; and
the web server as the image runs it still answers others while three clients read slowly."""

from __future__ import annotations

import contextlib
import http.client
import json
import shlex
import socket
import time
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
import requests
import yaml
from django.db import connection
from rest_framework.authtoken.models import Token

from ratejobs.models import Call, Job
from ratejobs.selectors.results import PAGE_BUDGET_BYTES
from tests.realparts import PROJECT_ROOT
from tests.rest.realserver import MIB

# A file many times what the sockets between server and client hold (a few MiB on loopback),
# so the server waits for the client most of the time, and many pages (PAGE_BUDGET_BYTES of
# bodies each): 3,000 calls of 16 KB, about 47 MiB of JSON lines.
CALLS = 3000
BODY = b'{"pad": "' + b"x" * 16_000 + b'"}'
# The slow client: READ_BYTES, then a pause; about 6 MB/s, some seconds for the whole file.
READ_BYTES = 64 * 1024
PAUSE_SECONDS = 0.01
SAMPLE_EVERY_BYTES = MIB
# When the calls change: after this much is read the server is at most the sockets' buffers
# (SLOW_RECEIVE_BUFFER and the server's send buffer) and a page ahead, far from the end.
CHANGE_AFTER_BYTES = 8 * MIB
# What the download may add to the worker's peak memory: a page, held about three times over
# while it is read (the database driver's result, the rows' bytes, the text of one), and a
# piece of output; never the file's 47 MiB.
MAX_GROWTH = 4 * PAGE_BUDGET_BYTES
# Clients on slow links, and how long another request may take meanwhile (a few ms when a
# worker is free; a loaded test machine needs more).
SLOW_CLIENTS = 3
SLOW_RECEIVE_BUFFER = 64 * 1024
PROBE_TIMEOUT = 10.0


@pytest.fixture
def large_job(make_job) -> Job:
    """A job of CALLS succeeded calls with BODY each."""
    job = make_job(calls=CALLS)
    Call.objects.filter(job=job).update(status="succeeded", attempts=1, response_body=BODY)
    return job


@pytest.fixture
def token_headers(user) -> dict[str, str]:
    return {"Authorization": f"Token {Token.objects.create(user=user).key}"}


@contextlib.contextmanager
def slow_download(url: str, headers: dict[str, str]) -> Iterator[http.client.HTTPResponse]:
    """A GET of `url` from a socket with a small receive buffer, as on a slow link (loopback's
    buffers, autotuned up to tens of MiB, would take most of the file at once): the response,
    its head read and its body not yet."""
    parts = urlsplit(url)
    head = f"GET {parts.path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()
    )
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SLOW_RECEIVE_BUFFER)
        client.settimeout(60)
        client.connect((parts.hostname, parts.port))
        client.sendall(head.encode("latin-1") + b"\r\n")
        response = http.client.HTTPResponse(client)
        response.begin()
        assert response.status == 200
        yield response


def sessions_of(application_name: str) -> list[tuple[str, bool]]:
    """Each session of that application: its state, and whether it holds a snapshot (xmin)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, backend_xmin IS NOT NULL FROM pg_stat_activity "
            "WHERE application_name = %s",
            [application_name],
        )
        return cursor.fetchall()


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgresql  # pg_stat_activity
@pytest.mark.timeout(240)
def test_a_slow_download_holds_no_transaction_and_gives_every_call_once_as_it_changes(
    web_server, large_job, make_job, token_headers
):
    app = f"ratejobs-export-{uuid.uuid4().hex[:8]}"
    server = web_server(PGAPPNAME=app)
    url = f"{server.url}/api/jobs/{large_job.pk}/results.jsonl"
    # warm up: the worker has served a download (imports, connection) before its peak is read
    small = make_job(calls=3)
    warm = requests.get(f"{server.url}/api/jobs/{small.pk}/results.jsonl", headers=token_headers,
                        timeout=60)  # fmt: skip
    assert warm.status_code == 200 and len(warm.content.splitlines()) == 3
    before = server.peak_rss()

    # when: a client reads the file slowly; meanwhile every call changes once
    received, samples, changed = bytearray(), [], False
    with slow_download(url, token_headers) as response:
        while piece := response.read(READ_BYTES):
            received += piece
            if len(received) >= SAMPLE_EVERY_BYTES * (len(samples) + 1):
                samples.append(sessions_of(app))
            if not changed and len(received) >= CHANGE_AFTER_BYTES:
                changed = Call.objects.filter(job=large_job).update(attempts=2) == CALLS
            time.sleep(PAUSE_SECONDS)
    growth = server.peak_rss() - before
    print(f"\n{len(received) / MIB:.1f} MiB in {len(samples)} samples: {samples[:3]} ...; peak RSS "
          f"grew {growth / MIB:.1f} MiB")  # fmt: skip

    # expect: the server's session was there, and never in a transaction or holding a snapshot
    seen = [session for sample in samples for session in sample]
    assert len(samples) >= 30 and seen
    assert {state for state, _ in seen} <= {"idle", "active"}, samples
    assert not [state for state, xmin in seen if state == "idle" and xmin], samples
    # and every call once, in index order: those read before the change as they were, the last
    # ones as they are now (each page is read when it is needed, not from an early snapshot)
    rows = [json.loads(line) for line in received.splitlines()]
    assert [row["index"] for row in rows] == list(range(CALLS))
    assert rows[0]["attempts"] == 1 and rows[-1]["attempts"] == 2
    assert all(row["response_body"] == BODY.decode() for row in rows)
    # and the worker's memory did not follow the file
    assert changed and len(received) > MAX_GROWTH + 10 * MIB
    assert growth < MAX_GROWTH


def image_web_server() -> tuple[int, str]:
    """The image's gunicorn workers, and its other options but --bind as GUNICORN_CMD_ARGS
    (the Dockerfile's CMD, which docker-compose.yml's web service runs too)."""
    cmd = next(
        line.removeprefix("CMD ")
        for line in (PROJECT_ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("CMD ")
    )
    argv = json.loads(cmd)
    compose = yaml.safe_load((PROJECT_ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["web"]["command"] == argv
    assert argv[:2] == ["gunicorn", "project.wsgi"]
    options = dict(zip(argv[2::2], argv[3::2], strict=True))  # every option takes a value
    options.pop("--bind")
    workers = int(options.pop("--workers"))
    return workers, shlex.join(word for option in options.items() for word in option)


@contextlib.contextmanager
def stalled_downloads(url: str, headers: dict[str, str]) -> Iterator[None]:
    """SLOW_CLIENTS downloads of `url` that read a little and then nothing: each holds whatever
    serves it."""
    with contextlib.ExitStack() as stack:
        for _ in range(SLOW_CLIENTS):
            assert stack.enter_context(slow_download(url, headers)).read(SLOW_RECEIVE_BUFFER)
        yield


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(240)
def test_three_slow_downloads_leave_the_images_web_server_answering(
    web_server, large_job, token_headers
):
    # given: the web server as the image runs it
    workers, options = image_web_server()
    server = web_server(workers=workers, GUNICORN_CMD_ARGS=options)
    job_url = f"{server.url}/api/jobs/{large_job.pk}/"
    assert requests.get(job_url, headers=token_headers, timeout=60).status_code == 200
    # when: three clients download the results and stop reading (each file is far more than
    # the sockets hold, so whatever serves each one waits on it)
    with stalled_downloads(f"{job_url}results.jsonl", token_headers):
        # expect: another request is answered meanwhile (with one sync worker per download,
        # it waited for a download to end)
        began = time.monotonic()
        answered = requests.get(job_url, headers=token_headers, timeout=PROBE_TIMEOUT)
        print(f"\n{options}, {workers} workers: answered in {time.monotonic() - began:.3f} s")
        assert answered.status_code == 200 and answered.json()["id"] == large_job.pk
