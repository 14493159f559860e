"""Who may send calls with a customer's credential key.

The decision: a credential key is usable by everyone who may submit jobs to its API, as the
API's own credential is; to keep a customer's credential to some people, put it on an API
restricted to their group (submitter_groups). So the keys that exist are no secret from those
who may use them (a job naming a missing one is told which), and nothing of them reaches
anyone else: a submission to an API one may not use is refused in the same words whether the
keys it names exist or not."""

from __future__ import annotations

from django.contrib.auth.models import Group

from ratejobs.services.credentials import credentials_add


def job(api, *, credential_key: str = "", call_key: str = "") -> dict:
    call = {"path": "/x", **({"credential_key": call_key} if call_key else {})}
    return {"api": api.name, "name": "j", "credential_key": credential_key, "calls": [call]}


def test_keys_are_named_only_to_those_who_may_submit_to_their_api(
    client_for, make_api, user, other_user
):
    # given an API of the billing group's, with a credential for the customer "acme"
    billing = Group.objects.create(name="billing")
    other_user.groups.add(billing)
    api = make_api()
    api.submitter_groups.set([billing])
    credentials_add(api=api, items=[("acme", "acme-secret-1")])
    outsider, member = client_for(user), client_for(other_user)

    # expect: an outsider gets one answer whatever the key, on the job or on a call
    answers = [
        outsider.post("/api/jobs/", job(api, **given), format="json")
        for given in ({"credential_key": "acme"}, {"credential_key": "nope"},
                      {"call_key": "acme"}, {"call_key": "nope"}, {})
    ]  # fmt: skip
    assert {answer.status_code for answer in answers} == {403}
    assert len({answer.content for answer in answers}) == 1
    # and a member may use the key, and is told which of theirs is missing
    assert member.post(
        "/api/jobs/", job(api, credential_key="acme"), format="json"
    ).status_code == (201)
    missing = member.post("/api/jobs/", job(api, call_key="nope"), format="json")
    assert missing.status_code == 400 and "nope" in missing.content.decode()
