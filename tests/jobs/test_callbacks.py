"""Job callbacks end to end: jobs run by real worker processes against the sandbox API, their
summaries POSTed to a real HTTP receiver on loopback, signed, retried, refused by the outbound
policy at send time; and two senders racing for one delivery."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from ratejobs.models import CallbackStatus, Job
from ratejobs.services.apis import api_create
from ratejobs.services.callbacks import (
    callbacks_requeue,
    job_callback_send,
    signing_key_rotate,
)
from ratejobs.services.jobs import job_cancel, job_create
from ratejobs.signing import SIGNATURE_HEADER, verify
from tests.realparts import wait_for_job

pytestmark = pytest.mark.django_db(transaction=True)

# Backoff of milliseconds, so three attempts take well under a second (the worker reads it).
FAST_RETRIES = {
    "RATEJOBS_CALLBACK_BACKOFF_BASE": "0.05",
    "RATEJOBS_CALLBACK_BACKOFF_CAP": "0.2",
}


@dataclass
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """A callback receiver on a real socket: /ok answers 200, /flaky 500 twice and then 200,
    /slow 200 after 0.5 s, /gone 410, /moved 307 to another origin."""

    server: ThreadingHTTPServer
    seen: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def url(self, path: str) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}{path}"

    def deliveries(self, path: str) -> list[Delivery]:
        with self.lock:
            return [d for d in self.seen if d.path == path]


def _handler(receiver: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with receiver.lock:
                receiver.seen.append(Delivery(self.path, dict(self.headers.items()), body))
                earlier = sum(1 for d in receiver.seen if d.path == self.path)
            if self.path == "/slow":
                time.sleep(0.5)
            status = 500 if self.path == "/flaky" and earlier <= 2 else 200
            status = {"/gone": 410, "/moved": 307}.get(self.path, status)
            self.send_response(status)
            if self.path == "/moved":  # to another origin: the same server by another name
                port = receiver.server.server_address[1]
                self.send_header("Location", f"http://localhost:{port}/elsewhere")
            self.send_header("Content-Length", "0")
            self.end_headers()

    return Handler


def _serve(host: str) -> Iterator[Receiver]:
    server = ThreadingHTTPServer((host, 0), BaseHTTPRequestHandler)
    receiver = Receiver(server)
    server.RequestHandlerClass = _handler(receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield receiver
    server.shutdown()
    server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    yield from _serve("127.0.0.1")


@pytest.fixture
def internal_receiver() -> Iterator[Receiver]:
    """A receiver on 127.0.0.2: loopback, but outside the tests' allow-list (127.0.0.1)."""
    yield from _serve("127.0.0.2")


@pytest.fixture
def owner():
    return get_user_model().objects.create_user("hooked", password="x")


def _wait_for_callback(job: Job, timeout: float) -> Job:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job.refresh_from_db()
        if job.callback_status in (CallbackStatus.DELIVERED, CallbackStatus.FAILED):
            return job
        time.sleep(0.1)
    raise AssertionError(f"callback of job {job.pk} still {job.callback_status!r}")


def test_finished_jobs_post_one_signed_summary_retry_5xx_and_never_reach_a_refused_address(
    owner, sandbox, start_worker, unique_name, receiver, internal_receiver
):
    # given the sandbox API, a signing key shown once, and three jobs with callbacks: to a
    # receiver that answers 200, to one that answers 500 twice, and one whose URL now points
    # at 127.0.0.2 (as when a name resolves elsewhere than when it was checked)
    server = sandbox(rate=200, burst=20)
    api = api_create(name=unique_name, base_url=server.url, rate=200, burst=20)
    _, secret = signing_key_rotate(user=owner)
    calls = [{"method": "GET", "path": f"/items/{i}"} for i in range(5)]
    ok, flaky, refused = (
        job_create(owner=owner, api=api, name=name, calls=calls, callback_url=receiver.url(path))
        for name, path in (("ok", "/ok"), ("flaky", "/flaky"), ("refused", "/ok"))
    )
    moved = internal_receiver.url("/ok")
    Job.objects.filter(pk=refused.pk).update(callback_url=moved)
    worker = start_worker(concurrency=2, **FAST_RETRIES)

    for job in (ok, flaky, refused):
        wait_for_job(job, timeout=60, poll=0.1)
        _wait_for_callback(job, timeout=30)

    # expect: exactly one POST for the job that finished, verifying with the key shown once
    (delivery,) = receiver.deliveries("/ok")
    assert verify(secret, delivery.body, delivery.headers[SIGNATURE_HEADER])
    assert not verify("another secret", delivery.body, delivery.headers[SIGNATURE_HEADER])
    summary = json.loads(delivery.body)
    assert summary["event"] == delivery.headers["X-Ratejobs-Event"] == "job.finished"
    assert (
        summary["delivery"] == delivery.headers["X-Ratejobs-Delivery"] == str(ok.callback_delivery)
    )
    assert delivery.headers["Content-Type"] == "application/json"
    assert delivery.headers["User-Agent"].startswith("ratejobs-callback/")
    assert summary["job"]["id"] == ok.pk and summary["job"]["uuid"] == str(ok.uuid)
    assert (summary["job"]["status"], summary["job"]["outcome"]) == ("completed", "succeeded")
    assert summary["job"]["counts"] == {
        "succeeded": 5, "failed": 0, "cancelled": 0, "pending": 0, "running": 0,
    }  # fmt: skip
    assert summary["job"]["results"]["jsonl"] == f"/api/jobs/{ok.pk}/results.jsonl"
    assert (ok.callback_status, ok.callback_attempts) == ("delivered", 1)
    assert ok.callback_delivered_at is not None and ok.callback_last_error == ""

    # the receiver answering 500 twice got three attempts of one delivery, the last delivered
    attempts = receiver.deliveries("/flaky")
    assert len(attempts) == 3
    assert {a.headers["X-Ratejobs-Delivery"] for a in attempts} == {str(flaky.callback_delivery)}
    assert all(verify(secret, a.body, a.headers[SIGNATURE_HEADER]) for a in attempts)
    assert (flaky.callback_status, flaky.callback_attempts) == ("delivered", 3)

    # the callback to 127.0.0.2 was refused when connecting: nothing reached it
    assert internal_receiver.seen == []
    assert (refused.callback_status, refused.callback_attempts) == ("failed", 1)
    assert "not allowed by the outbound policy" in refused.callback_last_error
    assert refused.callback_delivered_at is None
    # and the secret was never written where the worker logs
    assert secret not in worker.log.read_text()


@pytest.mark.postgresql
def test_two_senders_racing_for_one_delivery_post_it_once(owner, make_api, receiver):
    # given a finished job whose delivery is pending, and a receiver slow enough that two
    # senders started together overlap
    api = make_api()
    signing_key_rotate(user=owner)
    job = job_create(
        owner=owner,
        api=api,
        name="race",
        calls=[{"path": "/a"}],
        callback_url=receiver.url("/slow"),
    )
    job_cancel(job=job)
    results: list[str] = []
    start = threading.Barrier(2)

    def sender() -> None:
        start.wait()
        try:
            results.append(job_callback_send(job_id=job.pk))
        finally:
            connection.close()

    threads = [threading.Thread(target=sender) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # expect: one sent and delivered it, the other found it taken; one POST arrived
    assert sorted(results) == ["delivered", "skipped"]
    assert len(receiver.deliveries("/slow")) == 1
    job.refresh_from_db()
    assert (job.callback_status, job.callback_attempts) == ("delivered", 1)
    summary = json.loads(receiver.deliveries("/slow")[0].body)
    assert (summary["job"]["status"], summary["job"]["outcome"]) == ("cancelled", "cancelled")
    # and a later run (a redelivered message) sends nothing more
    assert job_callback_send(job_id=job.pk) == "skipped"
    assert len(receiver.deliveries("/slow")) == 1


def test_a_delivery_whose_sender_died_is_given_back_by_the_reconciler(owner, make_api):
    # given a delivery claimed by a sender whose claim ran out (a worker killed mid-send)
    api = make_api()
    signing_key_rotate(user=owner)
    job = job_create(
        owner=owner,
        api=api,
        name="orphan",
        calls=[{"path": "/a"}],
        callback_url="http://127.0.0.1:9/",
    )
    job_cancel(job=job)
    Job.objects.filter(pk=job.pk).update(
        callback_status=CallbackStatus.SENDING,
        callback_claimed_until="2000-01-01T00:00:00Z",
        finished="2000-01-01T00:00:00Z",
    )
    # expect: it is pending again and queued once more
    assert callbacks_requeue() >= 1
    job.refresh_from_db()
    assert job.callback_status == CallbackStatus.PENDING and job.callback_claimed_until is None


def _finished_with_callback(owner, api, url: str) -> Job:
    job = job_create(owner=owner, api=api, name="hooked", calls=[{"path": "/a"}], callback_url=url)
    return job_cancel(job=job)


def test_a_4xx_fails_the_delivery_at_once_and_a_redirect_elsewhere_drops_the_signature(
    owner, make_api, receiver
):
    api = make_api()
    signing_key_rotate(user=owner)
    gone = _finished_with_callback(owner, api, receiver.url("/gone"))
    moved = _finished_with_callback(owner, api, receiver.url("/moved"))

    # expect: 410 is not retried
    assert job_callback_send(job_id=gone.pk) == "failed"
    gone.refresh_from_db()
    assert (gone.callback_status, gone.callback_attempts) == ("failed", 1)
    assert gone.callback_last_error.startswith("the receiver answered 410")
    assert job_callback_send(job_id=gone.pk) == "skipped"
    # and a 307 to another origin is followed with the body but without the signature
    assert job_callback_send(job_id=moved.pk) == "delivered"
    (first,) = receiver.deliveries("/moved")
    (followed,) = receiver.deliveries("/elsewhere")
    assert SIGNATURE_HEADER in first.headers and SIGNATURE_HEADER not in followed.headers
    assert followed.body == first.body
