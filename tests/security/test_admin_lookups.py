"""Admin lists take only the lookups of the filters they show.

A staff member saw `X-Api-Key: ***` on an API's page but read the key a character at a time
through the changelist's field lookups (`?default_headers__X-Api-Key__regex=^sk_live_D` listed
the API or not). Every admin, Django's and DRF's included, is tried with lookups on each of its
model's fields, as each role, over the admin's real routes; and the attack itself is replayed
against gunicorn with a real login."""

from __future__ import annotations

import re
from typing import Any

import pytest
import requests
from django.contrib import admin
from django.contrib.auth.hashers import PBKDF2PasswordHasher, make_password
from django.db.models import JSONField
from django.urls import reverse

from ratejobs.admin.lookups import ShownFiltersOnly, shown_filter_parameters
from ratejobs.models import ThrottleEvent
from ratejobs.services.callbacks import signing_key_rotate
from tests.rest.realserver import web_server  # noqa: F401 (fixture)

KEY = "sk_live_DEFAULTHDR_SECRET_42"
# What a prober tries on a field: its value, and a pattern (of a key's value on a JSON field).
PROBES = ("{name}", "{name}__regex")
JSON_PROBE = "{name}__X-Api-Key__regex"


@pytest.fixture
def secret_api(make_api: Any) -> Any:
    return make_api(default_headers={"X-Api-Key": KEY, "Accept": "application/json"})


@pytest.fixture
def every_record(secret_api: Any, make_job: Any, user: Any) -> None:
    """A row in every model an admin lists, so that a lookup that matches would list it."""
    job = make_job(calls=2)
    ThrottleEvent.objects.create(api=secret_api, job=job, kind="throttled", status_code=429)
    signing_key_rotate(user=user)


def lookups(model: Any) -> list[str]:
    """What a prober tries on each name a query string can filter the model by: its fields,
    forward and reverse."""
    tried = []
    for field in model._meta.get_fields():
        if field.auto_created and not field.concrete:
            name = field.field.related_query_name()  # a reverse relation
        else:
            name = field.name
        probes = (*PROBES, JSON_PROBE) if isinstance(field, JSONField) else PROBES
        tried += [probe.format(name=name) for probe in probes]
    return tried


def changelist(model: Any) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")


@pytest.mark.slow
def test_every_admin_takes_only_the_lookups_of_its_shown_filters(
    every_record, admin_client_for, staff, superuser, rf
):
    # (a manager is staff with one permission more, which no filter depends on)
    for model, model_admin in admin.site._registry.items():
        assert isinstance(model_admin, ShownFiltersOnly), model
        url = changelist(model)
        for person in (staff, superuser):
            client = admin_client_for(person)
            request = rf.get(url)
            request.user = person
            shown = shown_filter_parameters(model_admin, request)
            plain = client.get(url)
            # a list of Django's (the signing key's page is one page of its own, which reads
            # no lookups)
            is_changelist = plain.status_code == 200 and "cl" in plain.context
            for lookup in lookups(model):
                if lookup in shown:
                    continue
                status = client.get(url, {lookup: "."}).status_code
                # expect: refused (400) wherever the list answers; any other page answers as it
                # does without the lookup (403 to a role that cannot see it)
                expected = 400 if is_changelist else plain.status_code
                assert status == expected, (model, person, lookup)


def test_the_shown_filters_and_the_admins_own_links_still_work(every_record, admin_client_for,
                                                               superuser, make_job):  # fmt: skip
    client = admin_client_for(superuser)
    for model, model_admin in admin.site._registry.items():
        url = changelist(model)
        request = client.get(url).wsgi_request
        for parameter in shown_filter_parameters(model_admin, request):
            value = "1" if not parameter.endswith("__isnull") else "True"
            if parameter.endswith(("__gte", "__lt")):
                value = "2030-01-01"
            assert client.get(url, {parameter: value}).status_code == 200, (model, parameter)
    # the job page's links to its calls and events
    job = make_job(calls=1)
    page = client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()
    for link in re.findall(r'href="(/admin/ratejobs/(?:call|throttleevent)/\?[^"]+)"', page):
        assert client.get(link.replace("&amp;", "&")).status_code == 200, link


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_a_staff_member_cannot_read_a_masked_key_through_lookups(web_server, make_api,  # noqa: F811
                                                                 django_user_model):  # fmt: skip
    # given: the API of the report, and a staff member logged in through the login page
    api = make_api(default_headers={"X-Api-Key": KEY})
    # hashed as the server's settings hash (the tests' own hasher is MD5, which it refuses)
    password = make_password("sam-password", hasher=PBKDF2PasswordHasher())
    django_user_model.objects.create(username="sam", password=password, is_staff=True)
    server = web_server()
    session = requests.Session()
    login = f"{server.url}/admin/login/"
    session.get(login, timeout=10)
    credentials = {"username": "sam", "password": "sam-password", "next": "/admin/"}
    token = {"csrfmiddlewaretoken": session.cookies["csrftoken"]}
    session.post(login, data={**credentials, **token}, timeout=10)
    listing = f"{server.url}/admin/ratejobs/api/"
    page = session.get(listing, params={"q": api.name}, timeout=10)
    assert page.url.startswith(listing) and f">{api.name}<" in page.text  # signed in
    # when: the prober's requests, a right and a wrong first character
    answers = {
        prefix: session.get(
            listing,
            params={"name": api.name, "default_headers__X-Api-Key__regex": f"^{prefix}"},
            timeout=10,
        )
        for prefix in ("sk_live_D", "sk_live_X")
    }
    # expect: the same refusal for both, and never the key
    assert {answer.status_code for answer in answers.values()} == {400}
    assert all(KEY not in answer.text for answer in answers.values())
