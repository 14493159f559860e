"""Names are shown as their owners wrote them: the admin capitalises nothing of a job's name."""

from __future__ import annotations

from django.urls import reverse


def test_a_job_named_in_lower_case_keeps_it_in_title_breadcrumbs_and_messages(
    root_client, make_job, superuser
):
    job = make_job(name="ui controls", owner=superuser)
    page = root_client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()
    assert f"<title>ui controls (#{job.pk})" in page
    assert f"&rsaquo; ui controls (#{job.pk})" in page  # the breadcrumbs' last step
    # and in the message an action leaves (Django's own template capitalised its first letter)
    paused = root_client.post(
        reverse("admin:ratejobs_job_act", args=[job.pk, "pause"]), follow=True
    ).content.decode()
    assert f">ui controls (#{job.pk}): paused" in paused
    assert "Ui controls" not in page + paused
