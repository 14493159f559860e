"""From a job to its calls and throttle events and back: the job's page links to its calls (all,
failed, by status code) and events, each call's and event's page to its job, and the lists
filter by job, API, status and status code."""

from __future__ import annotations

import html as html_lib
import re
from typing import Any

import pytest
from django.urls import reverse

from ratejobs.admin.calls import RECENT_JOBS
from ratejobs.models import Call, Job, ThrottleEvent

CALLS_URL = reverse("admin:ratejobs_call_changelist")
EVENTS_URL = reverse("admin:ratejobs_throttleevent_changelist")
# Call index: (status, status code) of the job below; call 6 never got an answer.
OUTCOMES = {
    0: ("succeeded", 200),
    1: ("succeeded", 200),
    2: ("succeeded", 200),
    3: ("failed", 500),
    4: ("failed", 500),
    5: ("succeeded", 429),
    6: ("pending", None),
}


def links(html: str, within: str = "") -> dict[str, str]:
    """The page's links by their text (tags and spaces squeezed); only those of the element
    whose opening tag holds `within` (up to its first "</div>") if given."""
    if within:
        html = html.split(within, 1)[1].split("</div>", 1)[0]
    found = re.findall(r'<a href="([^"]*)"[^>]*>(.*?)</a>', html, re.S)
    return {
        re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", text)).strip(): html_lib.unescape(href)
        for href, text in found
    }


def listed(client: Any, url: str, **params: Any) -> list[str]:
    """The rows of a change list: each call as "<job name> #<index>", each event by its id."""
    response = client.get(url, params)
    assert response.status_code == 200, response.content[:300]
    return [
        str(row) if isinstance(row, ThrottleEvent) else f"{row.job.name} #{row.index}"
        for row in response.context["cl"].result_list
    ]


def call_rows(client: Any, url: str, **params: Any) -> list[str]:
    return sorted(listed(client, url, **params))


@pytest.fixture
def job(make_job: Any) -> Job:
    """A job whose calls got 200, 500 and 429, and one no answer yet; and another job whose
    calls must never show in this one's lists."""
    job = make_job(calls=len(OUTCOMES), name="mine")
    for index, (status, code) in OUTCOMES.items():
        Call.objects.filter(job=job, index=index).update(status=status, status_code=code)
    Job.objects.filter(pk=job.pk).update(succeeded=4, failed=2)
    other = make_job(calls=2, name="other")
    Call.objects.filter(job=other).update(status="failed", status_code=500)
    return Job.objects.get(pk=job.pk)


def mine(*indexes: int) -> list[str]:
    return sorted(f"mine #{index}" for index in indexes)


def test_the_job_page_links_to_all_failed_and_each_status_code_of_its_calls(root_client, job):
    page = root_client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()
    assert "200 (3) · 429 (1) · 500 (2)" in re.sub(r"<[^>]+>", "", page)
    found = links(page, within='class="rj-calls-links"')
    assert found["All calls (7)"] == f"{CALLS_URL}?job__id__exact={job.pk}"
    # the job still runs: its counts say so
    assert "By status code so far" in page
    assert found["Failed (2 so far)"] == f"{CALLS_URL}?job__id__exact={job.pk}&status__exact=failed"
    assert found["200 (3)"] == f"{CALLS_URL}?job__id__exact={job.pk}&status_code__exact=200"
    # followed, each shows the job's calls it says, and no other job's
    follow = {text: call_rows(root_client, href) for text, href in found.items()}
    assert follow["All calls (7)"] == mine(0, 1, 2, 3, 4, 5, 6)
    assert follow["Failed (2 so far)"] == mine(3, 4)
    assert follow["200 (3)"] == mine(0, 1, 2)
    assert follow["429 (1)"] == mine(5)
    assert follow["500 (2)"] == mine(3, 4)


def test_the_final_counts_reach_the_open_page_once_the_job_is_final(root_client, job):
    # given the page's progress data while the job runs, and once it is final
    progress = reverse("admin:ratejobs_job_progress", args=[job.pk])
    assert root_client.get(progress).json()["calls_links"] is None
    type(job).objects.filter(pk=job.pk).update(status="completed")
    final = root_client.get(progress).json()["calls_links"]
    # expect: the final links, with no "so far"
    assert "200 (3) · 429 (1) · 500 (2)" in re.sub(r"<[^>]+>", "", final)
    assert "so far" not in final and "Failed (2)" in final


def test_a_job_without_failures_still_links_to_all_its_calls(root_client, make_job):
    job = make_job(calls=2, name="calm")
    page = root_client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()
    found = links(page, within='class="rj-calls-links"')
    assert call_rows(root_client, found["All calls (2)"]) == ["calm #0", "calm #1"]
    assert "By status code" not in page  # none answered yet
    # the failed sample's place says there are none, and links to all the calls too
    sample = links(page, within='id="rj-failed"')
    assert sample["All calls"] == f"{CALLS_URL}?job__id__exact={job.pk}"


def test_the_failed_sample_links_to_the_job_s_failed_calls(root_client, job):
    page = root_client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()
    sample = links(page, within='id="rj-failed"')
    assert call_rows(root_client, sample["All failed calls"]) == mine(3, 4)
    assert call_rows(root_client, sample["All calls"]) == mine(*OUTCOMES)


def test_the_job_page_links_to_its_throttle_events(root_client, job):
    other = Job.objects.get(name="other")
    ours = ThrottleEvent.objects.create(api=job.api, job=job, kind="throttled", status_code=429)
    ThrottleEvent.objects.create(api=job.api, job=other, kind="throttled", status_code=429)
    page = root_client.get(reverse("admin:ratejobs_job_change", args=[job.pk])).content.decode()
    href = links(page, within='class="rj-calls-links"')["Throttle events"]
    assert href == f"{EVENTS_URL}?job__id__exact={job.pk}"
    assert listed(root_client, href) == [str(ours)]


def test_a_call_s_page_and_an_event_s_page_link_to_their_job(root_client, job):
    call = job.calls.get(index=5)
    event = ThrottleEvent.objects.create(
        api=job.api, job=job, call=call, kind="throttled", status_code=429
    )
    job_url = reverse("admin:ratejobs_job_change", args=[job.pk])
    for url in (
        reverse("admin:ratejobs_call_change", args=[call.pk]),
        reverse("admin:ratejobs_throttleevent_change", args=[event.pk]),
    ):
        page = root_client.get(url).content.decode()
        field = page.split('class="form-row field-job"', 1)[1].split("</div>", 3)
        assert f'<a href="{job_url}">mine (#{job.pk})</a>' in "".join(field), url
        followed = root_client.get(job_url)
        assert followed.status_code == 200 and followed.context["original"] == job
    # and each event's row in the list links to its job
    table = root_client.get(EVENTS_URL).content.decode().split('id="result_list"', 1)[1]
    row_links = links(table.split("</table>", 1)[0])
    assert row_links["mine"] == job_url


def test_the_call_list_filters_by_job_api_status_and_status_code(root_client, job, make_api):
    elsewhere = make_api()
    moved = Job.objects.create(
        owner=job.owner, api=elsewhere, name="elsewhere", total=1, status="succeeded"
    )
    Call.objects.create(job=moved, index=0, method="GET", path="/e", status="failed",
                        status_code=500)  # fmt: skip
    every = call_rows(root_client, CALLS_URL)
    assert len(every) == len(OUTCOMES) + 3
    by_job = {"job__id__exact": job.pk}
    assert call_rows(root_client, CALLS_URL, **by_job) == mine(*OUTCOMES)
    assert call_rows(root_client, CALLS_URL, **by_job, status__exact="succeeded") == mine(
        0, 1, 2, 5
    )
    assert call_rows(root_client, CALLS_URL, **by_job, status__exact="pending") == mine(6)
    assert call_rows(root_client, CALLS_URL, **by_job, status_code__exact="429") == mine(5)
    assert call_rows(root_client, CALLS_URL, **by_job, status_code__exact="none") == mine(6)
    # across jobs: a status code, and an API
    assert call_rows(root_client, CALLS_URL, status_code__exact="500") == sorted(
        [*mine(3, 4), "other #0", "other #1", "elsewhere #0"]
    )
    assert call_rows(root_client, CALLS_URL, job__api__id__exact=elsewhere.pk) == ["elsewhere #0"]
    on_api = call_rows(root_client, CALLS_URL, job__api__id__exact=job.api_id)
    assert "elsewhere #0" not in on_api and len(on_api) == len(OUTCOMES) + 2
    # the sidebar offers each of them
    html = root_client.get(CALLS_URL).content.decode()
    for title in ("job", "api", "status", "status code"):
        assert f'data-filter-title="{title}"' in html, title
    assert f"job__api__id__exact={elsewhere.pk}" in html
    # a status code the job's calls never got, or nonsense, lists nothing
    assert call_rows(root_client, CALLS_URL, **by_job, status_code__exact="404") == []
    assert call_rows(root_client, CALLS_URL, job__id__exact="x") == []


def test_the_status_code_filter_offers_the_chosen_job_s_codes_with_counts(root_client, job):
    html = root_client.get(CALLS_URL, {"job__id__exact": job.pk}).content.decode()
    section = html.split('data-filter-title="status code"', 1)[1].split("</details>", 1)[0]
    offered = links(section)
    assert list(offered) == ["All", "200 (3)", "429 (1)", "500 (2)", "no response"]
    assert call_rows(root_client, CALLS_URL + offered["500 (2)"]) == mine(3, 4)


def test_the_job_filter_lists_the_newest_jobs_and_the_chosen_one_only(root_client, make_job):
    jobs = [make_job(calls=1, name=f"job-{n}") for n in range(RECENT_JOBS + 3)]
    oldest, newest = jobs[0], jobs[-1]
    html = root_client.get(CALLS_URL).content.decode()
    section = html.split('data-filter-title="job"', 1)[1].split("</details>", 1)[0]
    assert f"#{newest.pk} job-" in section and f"#{oldest.pk} job-" not in section
    assert section.count("job__id__exact=") == RECENT_JOBS
    assert 'name="job__id__exact"' in section  # and the box for any other job
    # chosen by its number, the oldest is offered too, as the chosen one
    html = root_client.get(CALLS_URL, {"job__id__exact": oldest.pk}).content.decode()
    section = html.split('data-filter-title="job"', 1)[1].split("</details>", 1)[0]
    assert re.search(rf'class="selected">\s*<a href="[^"]*">#{oldest.pk} job-0<', section)
    assert call_rows(root_client, CALLS_URL, job__id__exact=oldest.pk) == ["job-0 #0"]


def test_the_job_box_keeps_the_list_s_other_filters(root_client, job):
    html = root_client.get(
        CALLS_URL, {"status__exact": "failed", "o": "2", "job__id__exact": job.pk}
    ).content.decode()
    box = html.split('class="rj-job-filter"', 1)[1].split("</form>", 1)[0]
    assert '<input type="hidden" name="status__exact" value="failed">' in box
    assert '<input type="hidden" name="o" value="2">' in box
    assert 'name="job__id__exact"' in box and f'value="{job.pk}"' in box
    assert 'hidden" name="job__id__exact"' not in box


def test_the_older_job_parameter_still_filters(root_client, job):
    # links sent before (the overview, submit_job's output) named it ?job=
    assert call_rows(root_client, CALLS_URL, job=job.pk, outcome="failed") == mine(3, 4)
    html = root_client.get(CALLS_URL, {"job": job.pk}).content.decode()
    section = html.split('data-filter-title="job"', 1)[1].split("</details>", 1)[0]
    all_link = links(section)["All"]
    assert "job=" not in all_link.replace("job__id__exact", "")  # "All" drops it


def test_the_event_list_filters_by_job_and_api(root_client, job, make_api):
    other = Job.objects.get(name="other")
    elsewhere = make_api()
    first = ThrottleEvent.objects.create(api=job.api, job=job, kind="throttled")
    second = ThrottleEvent.objects.create(api=job.api, job=other, kind="throttled")
    blocked = ThrottleEvent.objects.create(api=elsewhere, kind="blocked")
    assert listed(root_client, EVENTS_URL, job__id__exact=job.pk) == [str(first)]
    assert listed(root_client, EVENTS_URL, job__id__exact=other.pk) == [str(second)]
    assert listed(root_client, EVENTS_URL, api__id__exact=elsewhere.pk) == [str(blocked)]
    assert sorted(listed(root_client, EVENTS_URL, api__id__exact=job.api_id)) == sorted(
        [str(first), str(second)]
    )
    html = root_client.get(EVENTS_URL).content.decode()
    for title in ("job", "api"):
        assert f'data-filter-title="{title}"' in html, title


def test_staff_filter_only_among_their_own_jobs(admin_client_for, staff, make_job, job):
    mine_job = make_job(calls=1, name="staff's", owner=staff)
    client = admin_client_for(staff)
    html = client.get(CALLS_URL).content.decode()
    section = html.split('data-filter-title="job"', 1)[1].split("</details>", 1)[0]
    assert f"#{mine_job.pk} staff" in section and f"#{job.pk} " not in section
    # another's job by number: no rows, and not its name
    response = client.get(CALLS_URL, {"job__id__exact": job.pk})
    assert response.status_code == 200 and list(response.context["cl"].result_list) == []
    assert f">#{job.pk} mine<" not in response.content.decode()
    page = client.get(reverse("admin:ratejobs_job_change", args=[mine_job.pk])).content.decode()
    found = links(page, within='class="rj-calls-links"')
    assert call_rows(client, found["All calls (1)"]) == ["staff's #0"]
