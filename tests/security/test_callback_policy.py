"""A plain user's callback_url reaches no port or path of an address the APIs' allow-list
admits (the sandbox's /__reset, the web server's own /api/jobs/), and the job shows nothing of
the answer. Callbacks have their own policy (RATEJOBS_CALLBACK_ALLOW, public addresses only by
default), checked at submit and on every address connected to, and the job keeps the status
of an answer, never its body.

Traffic goes to loopback only: other ranges are judged through a resolver that answers what a
test says, and the policy itself, never by connecting there."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from ratejobs.execution import HttpRequest, send
from ratejobs.execution.connections import new_session, session_for_process
from ratejobs.execution.outbound import AddressRefused, connect_allowed, policy_for
from ratejobs.models import CallbackStatus, Job
from ratejobs.services.callbacks import (
    NETWORK_ERRORS,
    NOT_ALLOWED_MESSAGE,
    attempt_verdict,
    callback_policy,
    callback_url_check,
    job_callback_send,
    signing_key_rotate,
)
from ratejobs.services.jobs import job_cancel, job_create
from tests.execution.test_outbound import answers
from tests.jobs.test_callbacks import internal_receiver, receiver  # noqa: F401 (fixtures)
from tests.rest.test_jobs import job_payload

LOOPBACK = ["127.0.0.1/32", "::1/128"]


@pytest.fixture
def apis_on_loopback_callbacks_public_only(settings):
    """The deployment of the finding: managers allowed loopback for an internal API, callbacks
    keep the default (public addresses only)."""
    settings.RATEJOBS_OUTBOUND_ALLOW = LOOPBACK
    settings.RATEJOBS_CALLBACK_ALLOW = []


# -- the attack, replayed -------------------------------------------------------------------------


def test_a_plain_users_callback_to_a_loopback_service_is_refused_at_submit_and_at_connect(
    apis_on_loopback_callbacks_public_only,
    settings,
    client_for,
    user,
    make_api,
    http_server,
    marker,
):
    # given a plain user with a signing key, and a real HTTP service on loopback that the
    # APIs' allow-list admits (the sandbox's /__reset, the web server's /api/jobs/)
    assert policy_for(LOOPBACK).allows("127.0.0.1").allowed
    client = client_for(user)
    assert client.post("/api/signing-key/", format="json").status_code == 201
    api = make_api()
    targets = [
        http_server.url(f"/__reset/{marker}"),
        http_server.url(f"/api/jobs/{marker}", host="localhost"),
    ]

    # when they submit a job with each as its callback_url, as JSON and as an upload
    for url in targets:
        submitted = client.post(
            "/api/jobs/", job_payload(api.name, callback_url=url), format="json"
        )
        uploaded = client.generic(
            "POST",
            f"/api/jobs/upload/?api={api.name}&name=up&callback_url={url}",
            b'{"path": "/x"}\n',
            content_type="application/x-ndjson",
        )
        # expect: 400 under callback_url, in the one message that says nothing of the network
        for response in (submitted, uploaded):
            assert response.status_code == 400, response.content
            assert response.json()["callback_url"] == [NOT_ALLOWED_MESSAGE]
    assert not Job.objects.filter(owner=user).exists()

    # and when the URL gets into the database anyway (bypassing the submit), in a worker whose
    # API calls keep a connection open to that service, the finished job's delivery, sent as
    # the worker's task does, is refused on the address connected to
    api_session = session_for_process(policy_for(settings.RATEJOBS_OUTBOUND_ALLOW))
    assert send(api_session, HttpRequest(method="GET", url=http_server.url("/ok"))).ok
    created = client.post("/api/jobs/", job_payload(api.name), format="json")
    assert created.status_code == 201, created.content
    job_id = created.json()["id"]
    Job.objects.filter(pk=job_id).update(callback_url=targets[0])
    assert client.post(f"/api/jobs/{job_id}/cancel/").status_code == 200
    assert job_callback_send(job_id=job_id) == "failed"

    # expect: the listener got nothing, and the owner reads fixed words, not the address
    assert http_server.requests_with(marker) == []
    job = Job.objects.get(pk=job_id)
    assert (job.callback_status, job.callback_attempts) == (CallbackStatus.FAILED, 1)
    assert job.callback_last_error == NETWORK_ERRORS["refused"]
    shown = client.get(f"/api/jobs/{job_id}/").json()
    assert shown["callback_last_error"] == NETWORK_ERRORS["refused"]


def test_a_redirect_to_an_address_allowed_for_apis_but_not_for_callbacks_is_not_followed(
    settings,
    owner_with_key,
    make_api,
    receiver,  # noqa: F811 (fixture)
    internal_receiver,  # noqa: F811 (fixture)
):
    # given callbacks allowed to the receiver on 127.0.0.1 only, APIs to all of loopback, and
    # a receiver answering 307 to a service on 127.0.0.2
    settings.RATEJOBS_OUTBOUND_ALLOW = ["127.0.0.0/8"]
    settings.RATEJOBS_CALLBACK_ALLOW = ["127.0.0.1/32"]
    receiver.away_to = internal_receiver.url("/internal")
    job = _finished_bypassing_the_submit(owner_with_key, make_api(), receiver.url("/away"))

    assert job_callback_send(job_id=job.pk) == "failed"

    # expect: the redirect is the answer, not followed: nothing reached 127.0.0.2
    assert len(receiver.deliveries("/away")) == 1
    assert internal_receiver.seen == []
    job.refresh_from_db()
    assert job.callback_last_error.startswith("the receiver answered 307 (Temporary Redirect)")


# -- the receiver's answer stays with the receiver -------------------------------------------------


@pytest.mark.parametrize("status", [500, 404])
def test_a_receivers_answer_body_never_reaches_the_job_or_its_views(
    settings,
    staff,
    superuser,
    client_for,
    admin_client_for,
    make_api,
    receiver,  # noqa: F811 (fixture)
    status,
    caplog,
):
    # given a receiver the callback policy allows (loopback, as an operator's internal one),
    # answering with a body that holds a secret, on the last attempt of the delivery
    settings.RATEJOBS_CALLBACK_ALLOW = LOOPBACK
    settings.RATEJOBS_CALLBACK_MAX_ATTEMPTS = 1
    secret = f"internal-only-{uuid.uuid4().hex}"
    receiver.answer = f'{{"error": "db password is {secret}"}}'.encode()
    signing_key_rotate(user=staff)
    job = _finished_bypassing_the_submit(staff, make_api(), receiver.url(f"/answer/{status}"))

    with caplog.at_level(logging.DEBUG):
        assert job_callback_send(job_id=job.pk) == "failed"

    # expect: the attempt was made, and the job keeps the status and its standard phrase
    assert len(receiver.deliveries(f"/answer/{status}")) == 1
    job.refresh_from_db()
    expected = {500: "500 (Internal Server Error)", 404: "404 (Not Found)"}[status]
    assert expected in job.callback_last_error
    # and no view of the job, its owner's or the superuser's, REST or admin, holds the secret,
    # nor does the worker's log
    rest = client_for(staff)
    admin_pages = [
        reverse("admin:ratejobs_job_change", args=[job.pk]),
        reverse("admin:ratejobs_job_changelist"),
    ]
    pages = [
        rest.get(f"/api/jobs/{job.pk}/"),
        rest.get("/api/jobs/"),
        *(
            admin_client_for(person).get(page)
            for person in (staff, superuser)
            for page in admin_pages
        ),
    ]
    for page in pages:
        assert page.status_code == 200
    assert pages[0].json()["callback_last_error"] == job.callback_last_error
    assert all(secret not in page.content.decode() for page in pages)
    assert f"job={job.pk} " in caplog.text and secret not in caplog.text


# -- other ranges: the resolver and the policy, never a connection --------------------------------

NOT_PUBLIC = ["169.254.169.254", "10.1.2.3", "172.16.0.9", "192.168.1.1", "127.0.0.1", "::1",
              "fd00::1", "::ffff:10.0.0.1"]  # fmt: skip
PUBLIC = "93.184.216.34"


@pytest.mark.parametrize("address", NOT_PUBLIC)
def test_a_callback_host_resolving_anywhere_but_public_is_refused_in_one_message(
    apis_on_loopback_callbacks_public_only, settings, owner_with_key, address
):
    # given the APIs' allow-list admitting every such range, callbacks the default
    settings.RATEJOBS_OUTBOUND_ALLOW = [*LOOPBACK, "10.0.0.0/8", "169.254.0.0/16", "fd00::/8"]
    resolver = answers(address)

    # expect: at submit, the same 400 whatever the range
    with pytest.raises(ValidationError) as refused:
        callback_url_check(
            owner=owner_with_key, url="https://hooks.example.test/x", resolver=resolver
        )
    assert refused.value.message_dict == {"callback_url": [NOT_ALLOWED_MESSAGE]}
    # and at connect time, before any socket: the operator's error names the address and why
    with pytest.raises(AddressRefused) as at_connect:
        connect_allowed("hooks.example.test", 443, callback_policy(), timeout=1, resolver=resolver)
    assert "not allowed by the outbound policy (RATEJOBS_CALLBACK_ALLOW)" in str(at_connect.value)


def test_a_callback_host_resolving_to_a_public_address_passes(
    apis_on_loopback_callbacks_public_only, owner_with_key
):
    callback_url_check(
        owner=owner_with_key, url="https://hooks.example.test/x", resolver=answers(PUBLIC)
    )
    assert callback_policy().allows(PUBLIC).allowed


def test_a_name_with_one_refused_address_among_public_ones_is_refused(
    apis_on_loopback_callbacks_public_only, owner_with_key
):
    with pytest.raises(ValidationError) as refused:
        callback_url_check(
            owner=owner_with_key,
            url="https://hooks.example.test/x",
            resolver=answers(PUBLIC, "169.254.169.254"),
        )
    assert refused.value.message_dict == {"callback_url": [NOT_ALLOWED_MESSAGE]}


def test_the_callback_allow_list_admits_what_it_names_and_nothing_else(settings, owner_with_key):
    # given an operator allowing callbacks to one private network and one internal name
    settings.RATEJOBS_OUTBOUND_ALLOW = []
    settings.RATEJOBS_CALLBACK_ALLOW = ["10.20.0.0/16", "hooks.corp.internal"]

    def must_not_resolve(*args, **kwargs):
        raise AssertionError("an allowed host name is not resolved at submit")

    # expect: those pass, their neighbours and the metadata service do not
    callback_url_check(
        owner=owner_with_key, url="http://10.20.1.5/h", resolver=answers("10.20.1.5")
    )
    callback_url_check(
        owner=owner_with_key, url="http://hooks.corp.internal/h", resolver=must_not_resolve
    )
    for address in ("10.21.0.1", "169.254.169.254"):
        with pytest.raises(ValidationError):
            callback_url_check(
                owner=owner_with_key, url="http://other.example.test/h", resolver=answers(address)
            )
    # and the APIs' allow-list never admits a callback: it has a policy of its own
    settings.RATEJOBS_OUTBOUND_ALLOW = ["172.16.0.0/12"]
    with pytest.raises(ValidationError):
        callback_url_check(
            owner=owner_with_key, url="http://172.16.0.9/h", resolver=answers("172.16.0.9")
        )


def test_a_delivery_whose_name_now_resolves_to_metadata_is_refused_in_fixed_words():
    # given a name that passed at submit and resolves to the metadata service for the worker
    # (DNS rebinding); the callback policy's session, with that resolver
    session = new_session(callback_policy(), resolver=answers("169.254.169.254"))
    request = HttpRequest(method="POST", url="http://hooks.example.test/h", body=b"{}")

    result = send(session, request, connect_timeout=1, read_timeout=1, total_timeout=2)
    session.close()
    verdict = attempt_verdict(result, now=0.0)

    # expect: refused before connecting; the owner's words fixed, the operator's precise
    assert result.error_kind == "refused" and result.status_code is None
    assert (verdict.kind, verdict.error) == ("failed", NETWORK_ERRORS["refused"])
    assert "169.254.169.254" not in verdict.error
    assert "169.254.169.254" in verdict.detail and "RATEJOBS_CALLBACK_ALLOW" in verdict.detail


# -- helpers ---------------------------------------------------------------------------------------


@pytest.fixture
def owner_with_key(user):
    signing_key_rotate(user=user)
    return user


def _finished_bypassing_the_submit(owner, api, url: str) -> Job:
    """A cancelled (finished) job whose callback is `url`, however the submit would judge it."""
    job = job_create(owner=owner, api=api, name="hooked", calls=[{"path": "/a"}])
    Job.objects.filter(pk=job.pk).update(callback_url=url)
    return job_cancel(job=Job.objects.get(pk=job.pk))
