"""`manage.py submit_job`: files in, a job stored through the same service as the admin and
the REST API, errors by line with nothing stored; `--wait` follows a real job to its end."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from ratejobs.management.commands import submit_job
from ratejobs.management.messages import clause, refusal
from ratejobs.models import Call, Job
from ratejobs.services.apis import api_create
from tests.realparts import PROJECT_ROOT, database_url

pytestmark = pytest.mark.usefixtures("services_redis")


@pytest.fixture
def root(django_user_model):
    return django_user_model.objects.create_superuser("root", password="root-password")


def submit(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("submit_job", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_a_jsonl_file_becomes_a_job_of_its_calls(api, root, tmp_path):
    calls = tmp_path / "calls.jsonl"
    calls.write_text(
        json.dumps({"path": "/items/1"}) + "\n\n" + json.dumps({"method": "POST", "path": "/items",
                                                               "json": {"n": 2}}) + "\n"
    )  # fmt: skip
    out, _ = submit("--api", api.name, "--file", str(calls), "--priority", "3")
    job = Job.objects.get()
    assert (job.name, job.total, job.priority, job.owner) == ("calls.jsonl", 2, 3, root)
    assert f"job {job.pk} submitted: 2 calls to {api.name}" in out
    assert f"/admin/ratejobs/job/{job.pk}/change/" in out
    assert list(job.calls.values_list("method", "path")) == [("GET", "/items/1"),
                                                             ("POST", "/items")]  # fmt: skip


def test_a_csv_file_and_standard_input_work_too(api, root, tmp_path, monkeypatch):
    csv_file = tmp_path / "calls.csv"
    csv_file.write_text("method,path,query\nGET,/a,x=1\nDELETE,/b,\n")
    submit("--api", api.name, "--file", str(csv_file), "--name", "from csv")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b'{"path": "/c"}\n')))
    submit("--api", api.name, "--file", "-")
    assert dict(Job.objects.values_list("name", "total")) == {
        "from csv": 2,
        "calls from standard input": 1,
    }
    assert Call.objects.get(path="/a").query == {"x": "1"}


@pytest.mark.parametrize(
    ("file_name", "content", "message"),
    [
        ("calls.jsonl", '{"path": "/a"}\n{"path": \n', "line 2: not valid JSON"),
        ("calls.jsonl", '{"path": "/a"}\n\n{"path": "https://evil.example/x"}\n', "line 3: path"),
        ("calls.jsonl", '{"path": "/a", "method": "BREW"}\n', "line 1: method"),
        ("calls.csv", "path,headers\n/a,\n/b,{oops\n", "line 3: column headers: not valid JSON"),
        ("calls.csv", "method,path\nGET,/a\n\nBREW,/b\n", "line 4: method"),
    ],
)
def test_a_bad_line_is_named_and_nothing_is_stored(
    api, root, make_job, tmp_path, file_name, content, message
):
    make_job()  # a job already there stays the only one
    calls = tmp_path / file_name
    calls.write_text(content)
    with pytest.raises(CommandError, match=message) as raised:
        submit("--api", api.name, "--file", str(calls))
    assert "nothing was stored" in str(raised.value)
    assert (Job.objects.count(), Call.objects.count()) == (1, 3)


def test_every_bad_line_is_listed_one_a_line(api, root, tmp_path):
    calls = tmp_path / "calls.csv"
    calls.write_text("path,method,json\n/a,GET,{oops\n/../x,GET,\n/c,BREW,\n")
    with pytest.raises(CommandError) as raised:
        submit("--api", api.name, "--file", str(calls))
    lines = str(raised.value).splitlines()
    assert lines[0] == f"{calls}: nothing was stored, for these errors:"
    assert [line.split(":")[0] for line in lines[1:]] == ["  line 2", "  line 3", "  line 4"]
    assert Job.objects.count() == 0


def test_a_refusal_reads_as_one_sentence(api, root, tmp_path):
    # given a priority below 1, which Django words as a sentence ending in a period
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n')
    with pytest.raises(CommandError) as raised:
        submit("--api", api.name, "--file", str(calls), "--priority", "0")
    message = str(raised.value)
    assert message.endswith("greater than or equal to 1; nothing was stored")
    assert ".;" not in message


def test_messages_are_joined_without_their_periods():
    assert refusal("line 2: bad.", " no call. ", "", "nothing was stored") == (
        "line 2: bad; no call; nothing was stored"
    )
    assert clause("wait...") == "wait..."


def test_unknown_api_owner_file_or_format_are_clear_errors(api, root, tmp_path, django_user_model):
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n')
    with pytest.raises(CommandError, match=f"no API named 'nope' \\(known: {api.name}\\)"):
        submit("--api", "nope", "--file", str(calls))
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        submit("--api", api.name, "--file", str(calls), "--owner", "ghost")
    django_user_model.objects.create_user("gone", password="x", is_active=False)
    with pytest.raises(CommandError, match="user 'gone' is inactive"):
        submit("--api", api.name, "--file", str(calls), "--owner", "gone")
    with pytest.raises(CommandError, match="cannot read .*missing.jsonl"):
        submit("--api", api.name, "--file", str(tmp_path / "missing.jsonl"))
    text = tmp_path / "calls.txt"
    text.write_text('{"path": "/a"}\n')
    with pytest.raises(CommandError, match="unsupported file type"):
        submit("--api", api.name, "--file", str(text))
    with pytest.raises(CommandError, match="priority: Ensure this value is less than or equal"):
        submit("--api", api.name, "--file", str(calls), "--priority", "1000")
    django_user_model.objects.create_superuser("second", password="x")
    with pytest.raises(CommandError, match="--owner USERNAME"):
        submit("--api", api.name, "--file", str(calls))
    assert Job.objects.count() == 0


def clock(sleep: Callable[[float], None]) -> SimpleNamespace:
    """The command's `time`, its sleep replaced (the time module stays whole for the rest)."""
    return SimpleNamespace(monotonic=time.monotonic, sleep=sleep)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_wait_redraws_one_line_on_a_terminal_and_exits_0_when_all_succeeded(
    api, root, tmp_path, monkeypatch
):
    # given a job that completes (as workers would) while the command waits
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n{"path": "/b"}\n')

    def workers_finish(seconds: float) -> None:
        Job.objects.update(status=Job.Status.COMPLETED, succeeded=2, finished=timezone.now())

    monkeypatch.setattr(submit_job, "time", clock(sleep=workers_finish))
    out, err = io.StringIO(), Terminal()
    call_command("submit_job", "--api", api.name, "--file", str(calls), "--wait",
                 stdout=out, stderr=err)  # fmt: skip
    # expect: the bar drawn over itself (\r, erase to end of line), ending on its last state
    progress = err.getvalue()
    assert progress.startswith("\r[" + "." * submit_job.BAR_WIDTH + "]   0.0% 0/2")
    assert progress.endswith("\r[" + "#" * submit_job.BAR_WIDTH + "] 100.0% 2/2  ok 2  failed 0"
                             "  429s 0  0.0/s  ETA —  (completed)\033[K\n")  # fmt: skip
    assert progress.count("\n") == 1
    assert "completed: 2 succeeded, 0 failed, 0 cancelled" in out.getvalue()


def test_a_partial_failure_reads_as_the_admin_says_and_names_a_command_to_list_the_calls(
    api, root, tmp_path, monkeypatch, client
):
    # given a job of 3 calls of which 1 fails and 1 is cancelled by its deadline
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n{"path": "/b"}\n{"path": "/c"}\n')

    def workers_finish(seconds: float) -> None:
        job = Job.objects.get()
        Call.objects.filter(job=job, index=0).update(status=Call.Status.SUCCEEDED)
        Call.objects.filter(job=job, index=1).update(status=Call.Status.FAILED)
        Call.objects.filter(job=job, index=2).update(status=Call.Status.CANCELLED)
        Job.objects.update(status=Job.Status.COMPLETED, succeeded=1, failed=1, cancelled=1,
                           finished=timezone.now())  # fmt: skip

    monkeypatch.setattr(submit_job, "time", clock(sleep=workers_finish))
    out, err = io.StringIO(), Terminal()
    with pytest.raises(CommandError) as raised:
        call_command("submit_job", "--api", api.name, "--file", str(calls), "--wait",
                     "--base-url", "https://ratejobs.example.com/",
                     stdout=out, stderr=err)  # fmt: skip
    job = Job.objects.get()
    # expect: the admin's words, in the bar and in the summary, never a plain "completed"
    assert err.getvalue().endswith("(completed with failures)\033[K\n")
    assert f"job {job.pk} completed with failures: 1 succeeded, 1 failed, 1 cancelled" in (
        out.getvalue()
    )
    # and the error names a command a CLI user can run, and the admin's list of those calls
    message = str(raised.value)
    assert raised.value.returncode == submit_job.EXIT_CALLS_NOT_ALL_SUCCEEDED
    assert "/api/" not in message
    assert message.startswith("2 of 3 calls did not succeed; list them with: python manage.py ")
    link = message.split("in the admin: ", 1)[1].removesuffix(")")
    assert link.startswith("https://ratejobs.example.com/admin/ratejobs/call/?")
    # the admin's page lists that call, and only it (a filter it did not know would redirect)
    client.force_login(root)
    page = client.get(link.removeprefix("https://ratejobs.example.com"))
    assert page.status_code == 200
    assert [call.path for call in page.context["cl"].result_list] == ["/b"]
    command = message.split("python manage.py ", 1)[1].split(" (or ", 1)[0].split()
    assert command[:2] == ["export_results", str(job.pk)]
    output = tmp_path / command[command.index("--output") + 1]
    command[command.index("--output") + 1] = str(output)
    call_command(*command)
    assert [line.split(",")[3] for line in output.read_text().splitlines()[1:]] == [
        "failed",
        "cancelled",
    ]


@pytest.mark.parametrize(
    ("status", "counts", "words"),
    [
        (Job.Status.RUNNING, {"succeeded": 1}, "running"),
        (Job.Status.COMPLETED, {"succeeded": 2}, "completed"),
        (Job.Status.COMPLETED, {"succeeded": 1, "failed": 1}, "completed with failures"),
        (Job.Status.COMPLETED, {"succeeded": 1, "cancelled": 1}, "completed with failures"),
        (Job.Status.COMPLETED, {"failed": 2}, "failed"),
        (Job.Status.CANCELLED, {"succeeded": 1, "cancelled": 1}, "cancelled"),
    ],
)
def test_the_progress_line_ends_with_the_outcome_as_the_admin_words_it(api, status, counts, words):
    job = Job(api=api, status=status, total=2, **counts)
    assert submit_job.progress_line(job, 0.0).endswith(f"({words})")


def test_the_admin_link_is_whole_with_base_url_and_said_to_be_a_path_without(api, root, tmp_path):
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n')
    out, _ = submit("--api", api.name, "--file", str(calls))
    first = Job.objects.get()
    assert out.strip().endswith(
        f"(admin: /admin/ratejobs/job/{first.pk}/change/ on your ratejobs web server; "
        "--base-url gives the whole link)"
    )
    out, _ = submit("--api", api.name, "--file", str(calls), "--base-url",
                    "https://jobs.example.com/ratejobs")  # fmt: skip
    second = Job.objects.exclude(pk=first.pk).get()
    assert out.strip().endswith(
        f"(admin: https://jobs.example.com/ratejobs/admin/ratejobs/job/{second.pk}/change/)"
    )
    for bad in ("jobs.example.com", "ftp://jobs.example.com", "https://jobs.example.com/?x=1"):
        with pytest.raises(CommandError, match="is not an http:// or https:// address"):
            submit("--api", api.name, "--file", str(calls), "--base-url", bad)
    assert Job.objects.count() == 2


def test_a_time_without_a_zone_is_refused_not_read_as_utc(api, root, tmp_path):
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n')
    for option in ("--not-before", "--deadline"):
        with pytest.raises(CommandError, match="has no time zone: add Z or an offset"):
            submit("--api", api.name, "--file", str(calls), option, "2099-12-01T08:00")
    submit("--api", api.name, "--file", str(calls), "--not-before", "2099-12-01T08:00+01:00")
    assert Job.objects.get().not_before.isoformat() == "2099-12-01T07:00:00+00:00"


def test_ctrl_c_while_waiting_exits_130_and_leaves_the_job_running(
    api, root, tmp_path, monkeypatch
):
    calls = tmp_path / "calls.jsonl"
    calls.write_text('{"path": "/a"}\n')

    def ctrl_c(seconds: float) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(submit_job, "time", clock(sleep=ctrl_c))
    with pytest.raises(CommandError, match="keeps running") as raised:
        submit("--api", api.name, "--file", str(calls), "--wait")
    job = Job.objects.get()
    assert raised.value.returncode == 130
    assert f"POST /api/jobs/{job.pk}/cancel/" in str(raised.value)
    assert job.status == Job.Status.QUEUED


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_wait_follows_a_real_job_and_the_exit_status_says_if_calls_failed(
    root, sandbox, start_worker, unique_name, tmp_path, redis_url
):
    # given a sandbox, an API at 50/s on it, one worker, and a file with 2 calls it answers 404
    server = sandbox(rate=100, burst=10, headers="none")
    api = api_create(name=unique_name, base_url=server.url, rate=50, burst=5)
    start_worker(concurrency=2)
    calls = tmp_path / "calls.jsonl"
    lines = [{"path": f"/items/{i}"} for i in range(18)] + [{"path": "/status/404"}] * 2
    calls.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings.test",
        "DATABASE_URL": database_url(),
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
    }

    def run(path: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "manage.py", "submit_job", "--api", api.name, "--file", path,
             "--owner", "root", "--wait", "--poll", "0.3"],
            cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    # expect: exit 1 with a summary when calls failed, progress lines on stderr (no terminal)
    failed = run(str(calls))
    print(failed.stdout, failed.stderr)
    assert failed.returncode == 1
    assert "18 succeeded, 2 failed, 0 cancelled" in failed.stdout
    assert "2 of 20 calls did not succeed" in failed.stderr
    assert "] 100.0% 20/20" in failed.stderr
    # and exit 0 when every call succeeded
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(line) + "\n" for line in lines[:5]))
    succeeded = run(str(good))
    assert succeeded.returncode == 0, succeeded.stderr
    assert "5 succeeded, 0 failed" in succeeded.stdout
