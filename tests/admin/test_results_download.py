"""The job page's "Download results" buttons: the REST API's files, for whoever sees the job."""

from __future__ import annotations

import json

from django.http import StreamingHttpResponse
from django.urls import reverse


def test_the_job_page_offers_both_files_and_they_download(root_client, make_job):
    job = make_job(calls=3)
    page = root_client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()
    for name in ("jsonl", "csv"):
        url = reverse("admin:ratejobs_job_results", args=[job.pk, name])
        assert f'<a href="{url}" class="rj-download" download>' in page
        assert f"Download results ({name.upper()})" in page
        response = root_client.get(url)
        assert isinstance(response, StreamingHttpResponse) and response.status_code == 200
        assert (
            response["Content-Disposition"] == f'attachment; filename="job-{job.pk}-results.{name}"'
        )
    lines = b"".join(root_client.get(url.replace(".csv", ".jsonl")).streaming_content).splitlines()
    assert [json.loads(line)["path"] for line in lines] == ["/items/0", "/items/1", "/items/2"]


def test_staff_download_their_own_job_and_not_another_format(admin_client_for, staff, make_job):
    job = make_job(calls=1, owner=staff)
    client = admin_client_for(staff)
    assert (
        client.get(reverse("admin:ratejobs_job_results", args=[job.pk, "csv"])).status_code == 200
    )
    assert client.get(f"/admin/ratejobs/job/{job.pk}/results.xml").status_code == 404
