"""Files kept between tries of the admin's submit page fill nothing:
three refused 15 MiB submits grew the Redis of the limiter and the broker by 64 MiB, a copy
an hour under a new token each. Now one file a user, in the database, within a total."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from ratejobs import uploads
from ratejobs.models import KeptUpload
from ratejobs.services.retention import retention_run

MIB = 1024 * 1024
ADD_URL = reverse("admin:ratejobs_job_add")


@pytest.fixture(autouse=True)
def _count_few_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """These files are about their size, not their errors: counting 100,000 of them per try
    would only slow the tests."""
    monkeypatch.setattr(uploads, "MAX_LINES_READ_AFTER_AN_ERROR", 100)


def refused_file(name: str, size: int) -> SimpleUploadedFile:
    """A CSV of `size` bytes whose every call the job service refuses (a negative cost)."""
    row = b"/a,-1\n"
    return SimpleUploadedFile(name, b"path,cost\n" + row * (size // len(row)))


def submit(client, api, **fields):
    return client.post(ADD_URL, {"api": api.pk, "name": "n", "priority": 1, **fields})


def test_refused_submits_keep_one_file_a_user_and_nothing_in_redis(
    admin_client_for, superuser, api, redis_client
):
    client = admin_client_for(superuser)
    before = redis_client.info("memory")["used_memory"]
    pages = [submit(client, api, calls_file=refused_file(f"big-{n}.csv", 15 * MIB))
             for n in range(3)]  # fmt: skip
    grown = redis_client.info("memory")["used_memory"] - before
    for page in pages:
        assert page.status_code == 200 and "Using <strong>big-" in page.content.decode()
    # expect: the last file alone, in the database; Redis (shared with other tests, so some
    # noise) grown by far less than one file
    (kept,) = KeptUpload.objects.filter(user=superuser)
    assert kept.name == "big-2.csv" and kept.size > 14 * MIB
    assert grown < 8 * MIB, f"Redis grew {grown / MIB:.1f} MiB"
    # and the earlier tokens name nothing any more
    first = pages[0].context["form"].kept.token
    assert "is gone: choose it again" in submit(client, api, kept_upload=first).content.decode()


def test_files_are_kept_within_a_total_for_everyone(
    admin_client_for, superuser, django_user_model, api, settings
):
    settings.RATEJOBS_KEPT_UPLOADS_MAX_TOTAL_BYTES = 3 * MIB
    other = django_user_model.objects.create_superuser("root2", password="x")
    assert (
        "Using <strong>a.csv"
        in submit(
            admin_client_for(superuser), api, calls_file=refused_file("a.csv", 2 * MIB)
        ).content.decode()
    )
    page = submit(admin_client_for(other), api, calls_file=refused_file("b.csv", 2 * MIB))
    html = page.content.decode()
    assert "b.csv is not kept between tries: the space for kept files is full for now" in html
    assert "line 2: cost:" in html  # the errors are still all there
    # the first user's own next file replaces theirs, so it fits
    assert (
        "Using <strong>c.csv"
        in submit(
            admin_client_for(superuser), api, calls_file=refused_file("c.csv", 2 * MIB)
        ).content.decode()
    )


def test_a_file_too_large_to_keep_drops_the_one_kept_before(admin_client_for, superuser, api,
                                                            settings):  # fmt: skip
    settings.RATEJOBS_KEPT_UPLOAD_MAX_BYTES = 1 * MIB
    client = admin_client_for(superuser)
    token = (
        submit(client, api, calls_file=refused_file("small.csv", MIB // 2))
        .context["form"]
        .kept.token
    )
    page = submit(client, api, calls_file=refused_file("large.csv", 2 * MIB), kept_upload=token)
    assert "is larger than 1.0\xa0MB and is not kept between tries" in page.content.decode()
    assert not KeptUpload.objects.exists()


def test_expired_files_are_removed_by_the_retention_task(admin_client_for, superuser, api):
    submit(admin_client_for(superuser), api, calls_file=refused_file("old.csv", 1024))
    KeptUpload.objects.update(kept_until=KeptUpload.objects.get().kept_until - timedelta(hours=2))
    retention_run(run_seconds=5)
    assert not KeptUpload.objects.exists()
