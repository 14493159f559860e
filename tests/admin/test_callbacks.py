"""Job callbacks in the admin: the signing-key page shows a new secret once, the submit page
takes a callback URL under the same checks as the REST API, and the job page shows the
delivery; and `submit_job --callback-url`."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from ratejobs.crypto import decrypt_secret
from ratejobs.models import Job, SigningKey
from ratejobs.services.callbacks import signing_key_rotate
from ratejobs.services.jobs import job_cancel

KEY_URL = reverse("admin:ratejobs_signingkey_changelist")
ROTATE_URL = reverse("admin:ratejobs_signingkey_rotate")
ADD_URL = reverse("admin:ratejobs_job_add")
HOOK = "http://127.0.0.1:9/hooks/ratejobs"


def test_the_signing_key_page_shows_a_new_secret_once(root_client, superuser):
    assert "You have no signing key yet" in root_client.get(KEY_URL).content.decode()
    # a GET only asks; the POST makes the key and shows its secret on that page
    assert root_client.get(ROTATE_URL).status_code == 200
    assert not SigningKey.objects.filter(user=superuser).exists()
    made = root_client.post(ROTATE_URL)
    assert made.status_code == 200 and "no-store" in made["Cache-Control"]
    secret = decrypt_secret(SigningKey.objects.get(user=superuser).secret_encrypted)
    assert secret in made.content.decode()
    # expect: never again, on its page or after the next rotation
    again = root_client.get(KEY_URL).content.decode()
    assert "You have a signing key" in again and secret not in again
    rotated = root_client.post(ROTATE_URL).content.decode()
    assert secret not in rotated


def test_the_submit_page_takes_a_callback_url_checked_like_the_rest_api(
    root_client, api, superuser
):
    fields = {"api": api.pk, "name": "hooked", "priority": 1, "method": "GET",
              "path_template": "/u/{id}", "values": "1"}  # fmt: skip
    assert 'name="callback_url"' in root_client.get(ADD_URL).content.decode()
    refused = root_client.post(ADD_URL, {**fields, "callback_url": HOOK})
    assert refused.status_code == 200
    assert "create a signing key first" in refused.content.decode()
    signing_key_rotate(user=superuser)
    internal = root_client.post(ADD_URL, {**fields, "callback_url": "http://169.254.169.254/"})
    assert "not allowed by the outbound policy" in internal.content.decode()
    assert not Job.objects.exists()
    made = root_client.post(ADD_URL, {**fields, "callback_url": HOOK})
    assert made.status_code == 302
    job = Job.objects.get()
    assert job.callback_url == HOOK
    # the job page shows the delivery once the job finished
    job_cancel(job=job)
    page = root_client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()
    assert HOOK in page and "pending" in page.lower()


@pytest.mark.usefixtures("services_redis")
def test_submit_job_takes_a_callback_url(api, superuser, tmp_path):
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n')
    args = ["--api", api.name, "--file", str(calls), "--callback-url", HOOK]
    with pytest.raises(CommandError, match="create a signing key first"):
        call_command("submit_job", *args, stdout=io.StringIO())
    signing_key_rotate(user=superuser)
    call_command("submit_job", *args, stdout=io.StringIO())
    assert Job.objects.get().callback_url == HOOK
