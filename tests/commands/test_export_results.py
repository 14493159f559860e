"""`manage.py export_results`: the REST download's rows, to a file or to stdout."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest
from django.core.management import CommandError, call_command

from ratejobs.models import Call, Job
from tests.realparts import PROJECT_ROOT, database_url
from tests.rest.test_results import OUTCOMES, expected_rows, record_outcomes

pytestmark = pytest.mark.usefixtures("services_redis")


@pytest.fixture
def results_job(make_job) -> Job:
    return record_outcomes(make_job(calls=len(OUTCOMES)))


def test_the_file_holds_the_rows_the_rest_api_gives(results_job, client_for, user, tmp_path):
    for suffix in ("jsonl", "csv"):
        target = tmp_path / f"out.{suffix}"
        call_command("export_results", str(results_job.pk), "--format", suffix,
                     "--output", str(target))  # fmt: skip
        served = client_for(user).get(f"/api/jobs/{results_job.pk}/results.{suffix}")
        assert target.read_bytes() == b"".join(served.streaming_content)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert rows == expected_rows()


def test_stdout_is_the_default_and_jsonl_the_default_format(results_job):
    out = io.StringIO()
    call_command("export_results", str(results_job.pk), stdout=out)
    assert [json.loads(line) for line in out.getvalue().splitlines()] == expected_rows()
    out = io.StringIO()
    call_command("export_results", str(results_job.pk), "--format", "csv", stdout=out)
    assert out.getvalue().startswith("index,method,path,status,")
    assert len(out.getvalue().splitlines()) == len(OUTCOMES) + 2  # a body holds a newline


def test_status_keeps_only_the_calls_that_ended_so(results_job, tmp_path):
    # given OUTCOMES: calls 0-3 succeeded, 4 failed, 5 cancelled
    out = io.StringIO()
    call_command("export_results", str(results_job.pk), "--status", "failed", stdout=out)
    assert [json.loads(line)["index"] for line in out.getvalue().splitlines()] == [4]
    target = tmp_path / "not-succeeded.csv"
    call_command("export_results", str(results_job.pk), "--status", "failed", "--status",
                 "cancelled", "--format", "csv", "--output", str(target))  # fmt: skip
    rows = list(csv.DictReader(io.StringIO(target.read_text(), newline="")))
    assert [(row["index"], row["status"]) for row in rows] == [("4", "failed"), ("5", "cancelled")]
    with pytest.raises(CommandError, match="invalid choice: 'broken'"):
        call_command("export_results", str(results_job.pk), "--status", "broken")


def test_a_missing_job_or_one_being_purged_is_an_error(results_job):
    with pytest.raises(CommandError, match="no such job"):
        call_command("export_results", str(results_job.pk + 1000))
    Job.objects.filter(pk=results_job.pk).update(purge_started="2026-01-01T00:00:00Z")
    with pytest.raises(CommandError, match="no such job"):
        call_command("export_results", str(results_job.pk))


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120)
def test_the_command_writes_bytes_to_a_real_stdout(make_job):
    # given: a process of its own, its stdout a pipe (the binary buffer path)
    job = make_job(calls=3)
    Call.objects.filter(job=job, index=1).update(response_body=b"\xff\x00")
    run = subprocess.run(
        [sys.executable, "manage.py", "export_results", str(job.pk), "--format", "jsonl"],
        cwd=PROJECT_ROOT, capture_output=True, timeout=100,
        env={**os.environ, "DATABASE_URL": database_url()},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr.decode()[-2000:]
    rows = [json.loads(line) for line in run.stdout.splitlines()]
    assert [row["index"] for row in rows] == [0, 1, 2]
    assert rows[1]["response_body_base64"] is True
