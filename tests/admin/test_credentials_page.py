"""The API page's credentials per customer: keys listed (count, first ones, search), added,
replaced and deleted by managers, never a secret; key buckets live from Redis; jobs take a
credential key from the submit form and show it."""

from __future__ import annotations

from django.urls import reverse

from ratejobs.crypto import decrypt_secret
from ratejobs.infra.limiters import api_limiter
from ratejobs.models import ApiCredential, Job
from ratejobs.services.credentials import credentials_add

SECRET = "Bearer page-canary-secret"


def test_the_api_page_lists_keys_and_buckets_and_never_a_secret(root_client, api):
    credentials_add(api=api, items=[(f"cust-{i:03}", f"{SECRET}-{i}") for i in range(60)])
    api_limiter(api, "cust-007").block(30)
    page = root_client.get(reverse("admin:ratejobs_api_change", args=[api.pk]))
    html = page.content.decode()
    assert "Credentials per customer" in html and "60 keys" in html
    assert "cust-000" in html and "cust-049" in html and "cust-059" not in html  # first 50
    assert 'id="rj-live-key-buckets">1<' in html and "cust-007" in html
    assert "page-canary" not in html
    found = root_client.get(
        reverse("admin:ratejobs_api_change", args=[api.pk]), {"credential_search": "05"}
    ).content.decode()
    # cust-005 and cust-050 to cust-059 (the bucket table still names cust-007)
    assert "cust-059" in found and "cust-001" not in found and "11 matching" in found


def test_a_manager_adds_replaces_and_deletes_a_key_from_the_api_page(root_client, api):
    save = reverse("admin:ratejobs_api_credential_save", args=[api.pk])
    delete = reverse("admin:ratejobs_api_credential_delete", args=[api.pk])
    assert root_client.post(save, {"key": "acme", "secret": "one"}).status_code == 302
    assert root_client.post(save, {"key": "acme", "secret": "two"}).status_code == 302
    assert decrypt_secret(ApiCredential.objects.get(key="acme").credential_encrypted) == "two"
    bad = root_client.post(save, {"key": "no:colons", "secret": "x"}, follow=True)
    assert "a credential key is" in bad.content.decode()
    root_client.post(delete, {"key": "acme"})
    assert not ApiCredential.objects.filter(api=api).exists()


def test_staff_who_do_not_manage_apis_cannot_touch_keys(admin_client_for, staff, api):
    client = admin_client_for(staff)
    save = reverse("admin:ratejobs_api_credential_save", args=[api.pk])
    assert client.post(save, {"key": "acme", "secret": "x"}).status_code == 403
    html = client.get(reverse("admin:ratejobs_api_change", args=[api.pk])).content.decode()
    assert "Credentials per customer" not in html
    assert not ApiCredential.objects.exists()


def test_the_submit_form_takes_a_credential_key_and_refuses_a_missing_one(root_client, api):
    credentials_add(api=api, items=[("acme", "x")])
    add = reverse("admin:ratejobs_job_add")
    fields = {"api": api.pk, "name": "keyed", "priority": 1, "method": "GET",
              "path_template": "/users/{id}", "values": "1\n2"}  # fmt: skip
    missing = root_client.post(add, {**fields, "credential_key": "ghost"})
    assert missing.status_code == 200 and "ghost" in missing.content.decode()
    assert not Job.objects.exists()
    root_client.post(add, {**fields, "credential_key": "acme"})
    job = Job.objects.get()
    assert job.credential_key == "acme"
    page = root_client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()
    assert "acme" in page
    call = job.calls.first()
    page = root_client.get(reverse("admin:ratejobs_call_change", args=[call.pk])).content.decode()
    assert "credential key" in page.lower() and "acme" in page
