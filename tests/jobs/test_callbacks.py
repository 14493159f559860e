"""Job callbacks end to end: jobs run by real worker processes against the sandbox API, their
summaries POSTed to a real HTTP receiver on loopback, signed, retried, refused by the outbound
policy at send time; and two senders racing for one delivery."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import redis
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import F
from django.utils import timezone

from ratejobs.models import Call, CallbackStatus, Job
from ratejobs.services import callbacks
from ratejobs.services.apis import api_create
from ratejobs.services.callbacks import (
    CALLBACK_TASK,
    NETWORK_ERRORS,
    callbacks_requeue,
    job_callback_send,
    signing_key_rotate,
)
from ratejobs.services.jobs import job_cancel, job_complete_if_done, job_create, job_retry_failed
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
    /slow 200 after 0.5 s, /gone 410, /moved 307 to another origin, /busy/<n> 503 with
    Retry-After: n, /answer/<code> <code> with `answer` as its body, /away 307 to `away_to`."""

    server: ThreadingHTTPServer
    seen: list[Delivery] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    answer: bytes = b""
    away_to: str = ""

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
            status = {"/gone": 410, "/moved": 307, "/away": 307}.get(self.path, status)
            answer = b""
            if self.path.startswith("/answer/"):
                status, answer = int(self.path.removeprefix("/answer/")), receiver.answer
            busy = self.path.startswith("/busy/")
            self.send_response(503 if busy else status)
            if busy:
                self.send_header("Retry-After", self.path.removeprefix("/busy/"))
            if self.path == "/moved":  # to another origin: the same server by another name
                port = receiver.server.server_address[1]
                self.send_header("Location", f"http://localhost:{port}/elsewhere")
            if self.path == "/away":
                self.send_header("Location", receiver.away_to)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

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
    # in fixed words for its owner; the address, the range and the setting for the operator
    assert refused.callback_last_error == NETWORK_ERRORS["refused"]
    assert "127.0.0.2" not in refused.callback_last_error
    log = worker.log.read_text()
    assert "127.0.0.2 is not allowed by the outbound policy (RATEJOBS_CALLBACK_ALLOW)" in log
    assert refused.callback_delivered_at is None
    # and the secret was never written where the worker logs
    assert secret not in log


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
    # finished long enough ago for the reconciler to queue it (not past its deadline)
    Job.objects.filter(pk=job.pk).update(
        callback_status=CallbackStatus.SENDING,
        callback_claimed_until="2000-01-01T00:00:00Z",
        finished=timezone.now() - timedelta(minutes=2),
    )
    # expect: it is pending again and queued once more
    assert callbacks_requeue() >= 1
    job.refresh_from_db()
    assert job.callback_status == CallbackStatus.PENDING and job.callback_claimed_until is None


def _job_with_callback(owner, api, url: str, calls: int = 1) -> Job:
    paths = [{"path": f"/items/{i}"} for i in range(calls)]
    return job_create(owner=owner, api=api, name="hooked", calls=paths, callback_url=url)


def _finished_with_callback(owner, api, url: str) -> Job:
    return job_cancel(job=_job_with_callback(owner, api, url))


def test_a_4xx_or_a_redirect_fails_the_delivery_at_once(owner, make_api, receiver):
    api = make_api()
    signing_key_rotate(user=owner)
    gone = _finished_with_callback(owner, api, receiver.url("/gone"))
    moved = _finished_with_callback(owner, api, receiver.url("/moved"))

    # expect: 410 is not retried
    assert job_callback_send(job_id=gone.pk) == "failed"
    gone.refresh_from_db()
    assert (gone.callback_status, gone.callback_attempts) == ("failed", 1)
    assert gone.callback_last_error == "the receiver answered 410 (Gone)"
    assert job_callback_send(job_id=gone.pk) == "skipped"
    # and a 307 is the receiver's answer, not followed (elsewhere it would arrive unsigned)
    assert job_callback_send(job_id=moved.pk) == "failed"
    assert len(receiver.deliveries("/moved")) == 1
    assert receiver.deliveries("/elsewhere") == []
    moved.refresh_from_db()
    assert moved.callback_last_error.startswith(
        "the receiver answered 307 (Temporary Redirect): a redirect is not followed"
    )


# -- every attempt counts ----------------------------------------------------------------------


def _send_when_due(job: Job) -> str:
    """Run the sender as the task does, once the delivery's next attempt is due."""
    job.refresh_from_db()
    if job.callback_next_attempt_at is not None:
        wait = (job.callback_next_attempt_at - timezone.now()).total_seconds()
        time.sleep(max(0.0, wait) + 0.05)
    return job_callback_send(job_id=job.pk)


def test_an_attempt_that_raises_counts_and_the_last_one_fails_the_delivery(
    owner, make_api, receiver, settings, monkeypatch
):
    # given 3 attempts a delivery, a fast backoff, and a bug in reading the receiver's answer:
    # the one seam allowed, patched after the real POST went out on a real socket
    settings.RATEJOBS_CALLBACK_MAX_ATTEMPTS = 3
    settings.RATEJOBS_CALLBACK_BACKOFF_BASE = 0.05
    settings.RATEJOBS_CALLBACK_BACKOFF_CAP = 0.2
    signing_key_rotate(user=owner)
    job = _finished_with_callback(owner, make_api(), receiver.url("/ok"))

    def bug(result, *, now):
        raise RuntimeError("a bug after the POST")

    monkeypatch.setattr(callbacks, "attempt_verdict", bug)

    # expect: the first attempt is a retry with its reason, counted, not left "sending"
    assert job_callback_send(job_id=job.pk) == "retry"
    job.refresh_from_db()
    assert (job.callback_status, job.callback_attempts) == ("pending", 1)
    assert job.callback_claimed_until is None
    assert "RuntimeError" in job.callback_last_error
    # and the third, the last, fails the delivery with that reason; nothing more is sent
    assert [_send_when_due(job), _send_when_due(job)] == ["retry", "failed"]
    job.refresh_from_db()
    assert (job.callback_status, job.callback_attempts) == ("failed", 3)
    assert job.callback_last_error.startswith("gave up after 3 attempts: the attempt raised")
    assert "RuntimeError" in job.callback_last_error
    assert job_callback_send(job_id=job.pk) == "skipped"
    assert callbacks_requeue() == 0
    assert len(receiver.deliveries("/ok")) == 3


def test_a_claim_that_expired_comes_back_only_within_the_attempts_and_the_deadline(
    owner, make_api, settings
):
    # given three deliveries whose sender died mid-attempt (their claims ran out): one at its
    # 2nd of 3 attempts, one at its 3rd and last, one at its 2nd but finished past its deadline
    settings.RATEJOBS_CALLBACK_MAX_ATTEMPTS = 3
    settings.RATEJOBS_CALLBACK_DEADLINE_SECONDS = 600
    signing_key_rotate(user=owner)
    api = make_api()
    jobs = [_finished_with_callback(owner, api, "http://127.0.0.1:9/") for _ in range(3)]
    now = timezone.now()
    for job, attempts, finished in zip(
        jobs, (2, 3, 2), (now, now, now - timedelta(seconds=601)), strict=True
    ):
        Job.objects.filter(pk=job.pk).update(
            callback_status=CallbackStatus.SENDING,
            callback_attempts=attempts,
            callback_claimed_until=now - timedelta(seconds=1),
            finished=finished,
        )

    callbacks_requeue()

    # expect: the first is given back, the last attempt's and the late one's fail with why
    given_back, last, late = (Job.objects.get(pk=job.pk) for job in jobs)
    assert (last.callback_status, last.callback_attempts) == ("failed", 3)
    assert last.callback_last_error.startswith("gave up after 3 attempts: the sender of")
    assert late.callback_status == "failed" and "deadline" in late.callback_last_error
    assert (given_back.callback_status, given_back.callback_attempts) == ("pending", 2)
    assert "claim expired" in given_back.callback_last_error
    assert all(j.callback_claimed_until is None for j in (given_back, last, late))
    assert last.callback_next_attempt_at is None and late.callback_next_attempt_at is None
    # and a failed one is never claimed again
    assert job_callback_send(job_id=last.pk) == job_callback_send(job_id=late.pk) == "skipped"


# -- a delivery carries the state its finish announced -----------------------------------------


def _calls_end(job: Job, status: str, indexes: list[int]) -> None:
    """Calls of the job end as a worker records them (their status, the job's counter, and the
    job completed once nothing is left)."""
    ended = Call.objects.filter(job=job, index__in=indexes).update(
        status=status, finished=timezone.now()
    )
    Job.objects.filter(pk=job.pk).update(**{status: F(status) + ended})
    job_complete_if_done(job_id=job.pk)


def test_a_delivery_sends_the_state_of_its_finish_not_the_jobs_when_sent(owner, make_api, receiver):
    # given a job cancelled while one of its two calls was on the wire
    signing_key_rotate(user=owner)
    job = _job_with_callback(owner, make_api(), receiver.url("/ok"), calls=2)
    Call.objects.filter(job=job, index=0).update(status=Call.Status.RUNNING)
    job_cancel(job=job)
    # when the call on the wire ends before the delivery goes out
    Call.objects.filter(job=job, index=0).update(status=Call.Status.SUCCEEDED)
    Job.objects.filter(pk=job.pk).update(succeeded=F("succeeded") + 1)

    assert job_callback_send(job_id=job.pk) == "delivered"

    # expect: the receiver got the state at the cancel: the body stored as the job finished
    (delivery,) = receiver.deliveries("/ok")
    assert json.loads(delivery.body)["job"]["counts"] == {
        "succeeded": 0, "failed": 0, "cancelled": 1, "pending": 0, "running": 1,
    }  # fmt: skip
    job.refresh_from_db()
    assert delivery.body == job.callback_body.encode()
    assert json.loads(job.callback_body)["delivery"] == str(job.callback_delivery)


def test_a_job_that_runs_again_supersedes_its_delivery_and_its_next_finish_sends_a_new_one(
    owner, make_api, receiver
):
    # given a job that completed with a failed call, its delivery not sent yet
    signing_key_rotate(user=owner)
    job = _job_with_callback(owner, make_api(), receiver.url("/ok"), calls=2)
    _calls_end(job, Call.Status.SUCCEEDED, [0])
    _calls_end(job, Call.Status.FAILED, [1])
    job.refresh_from_db()
    first = job.callback_delivery
    assert (job.status, job.callback_status) == ("completed", "pending")

    # when its failed call is retried: the job runs again
    job_retry_failed(job=job)

    # expect: the delivery announcing the first finish is superseded, and never sent
    job.refresh_from_db()
    assert job.status == "running"
    assert (job.callback_status, job.callback_delivery) == ("failed", first)
    assert job.callback_last_error.startswith("superseded: the job ran again")
    assert job_callback_send(job_id=job.pk) == "skipped"
    assert callbacks_requeue() == 0
    assert receiver.deliveries("/ok") == []
    # and when it finishes again, that finish gets a delivery of its own, with its state
    _calls_end(job, Call.Status.SUCCEEDED, [1])
    job.refresh_from_db()
    assert job.callback_status == "pending" and job.callback_delivery != first
    assert job_callback_send(job_id=job.pk) == "delivered"
    (delivery,) = receiver.deliveries("/ok")
    summary = json.loads(delivery.body)
    assert summary["delivery"] == delivery.headers["X-Ratejobs-Delivery"]
    assert summary["delivery"] == str(job.callback_delivery)
    assert (summary["job"]["status"], summary["job"]["outcome"]) == ("completed", "succeeded")
    assert summary["job"]["counts"]["succeeded"] == 2 and summary["job"]["counts"]["failed"] == 0


@pytest.mark.postgresql
def test_an_attempt_on_the_wire_when_the_job_runs_again_announces_its_finish_and_is_not_recorded(
    owner, make_api, receiver
):
    # given a completed job with a failed call, its delivery being sent to a slow receiver
    signing_key_rotate(user=owner)
    job = _job_with_callback(owner, make_api(), receiver.url("/slow"), calls=1)
    _calls_end(job, Call.Status.FAILED, [0])
    results: list[str] = []

    def sender() -> None:
        try:
            results.append(job_callback_send(job_id=job.pk))
        finally:
            connection.close()

    thread = threading.Thread(target=sender)
    thread.start()
    deadline = time.monotonic() + 5
    while not receiver.deliveries("/slow") and time.monotonic() < deadline:
        time.sleep(0.01)
    # when the job's failed call is retried while the receiver is still answering
    job_retry_failed(job=job)
    thread.join()

    # expect: what arrived says the job completed (its finish, not "running"); the sender's
    # outcome is not recorded over the superseded delivery
    (delivery,) = receiver.deliveries("/slow")
    assert json.loads(delivery.body)["job"]["status"] == "completed"
    assert results == ["skipped"]
    job.refresh_from_db()
    assert (job.status, job.callback_status) == ("running", "failed")
    assert job.callback_last_error.startswith("superseded")


# -- a receiver's Retry-After --------------------------------------------------------------------


def _take_queued(job: Job) -> list[float]:
    """The countdowns (seconds from now) of the job's callback messages waiting in the real
    broker, taken out of it."""
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    queue = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] + "celery"
    countdowns = []
    for raw in client.lrange(queue, 0, -1):
        headers = json.loads(raw)["headers"]
        if headers["task"] == CALLBACK_TASK and headers["argsrepr"] == f"[{job.pk}]":
            client.lrem(queue, 1, raw)
            eta = headers["eta"]
            at = time.time() if eta is None else datetime.fromisoformat(eta).timestamp()
            countdowns.append(at - time.time())
    client.close()
    return countdowns


def test_a_retry_after_past_the_backoff_cap_is_honoured_up_to_the_deadline_then_fails(
    owner, make_api, receiver
):
    # given the default backoff (capped at 900 s) and deadline (3,290 s after the finish), and
    # receivers asking to come back in 40 minutes and in 2 hours
    assert settings.RATEJOBS_CALLBACK_BACKOFF_CAP == 900
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS["visibility_timeout"]
    signing_key_rotate(user=owner)
    api = make_api()
    later = _finished_with_callback(owner, api, receiver.url("/busy/2400"))
    too_late = _finished_with_callback(owner, api, receiver.url("/busy/7200"))
    _take_queued(later)

    # expect: 40 minutes is waited in full, past the cap ...
    assert job_callback_send(job_id=later.pk) == "retry"
    later.refresh_from_db()
    due_in = (later.callback_next_attempt_at - timezone.now()).total_seconds()
    assert 2400 - 5 < due_in <= 2400
    # ... but not as one countdown in the broker, which would hand a message waiting longer than
    # its visibility timeout to a second worker: the message comes back at half of it
    (countdown,) = _take_queued(later)
    assert visibility / 2 - 5 < countdown <= visibility / 2
    # and when it comes, early, it sends nothing and waits the rest
    Job.objects.filter(pk=later.pk).update(
        callback_next_attempt_at=timezone.now() + timedelta(seconds=120)
    )
    assert job_callback_send(job_id=later.pk) == "skipped"
    (countdown,) = _take_queued(later)
    assert 110 < countdown <= 120
    assert len(receiver.deliveries("/busy/2400")) == 1
    # and 2 hours, past the deadline, fails the delivery at once, saying why
    assert settings.RATEJOBS_CALLBACK_DEADLINE_SECONDS == 3290
    assert job_callback_send(job_id=too_late.pk) == "failed"
    too_late.refresh_from_db()
    assert (too_late.callback_status, too_late.callback_attempts) == ("failed", 1)
    assert "Retry-After of 7200 s" in too_late.callback_last_error
    assert "deadline" in too_late.callback_last_error
    assert "the receiver answered 503" in too_late.callback_last_error
    assert len(receiver.deliveries("/busy/7200")) == 1
