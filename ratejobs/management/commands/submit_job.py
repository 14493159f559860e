"""`manage.py submit_job`: a job from a CSV or JSONL file of calls, optionally followed to the
end with a progress bar; the exit status says whether every call succeeded."""

from __future__ import annotations

import argparse
import time
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.urls import reverse

from ratejobs.admin.calls import calls_url
from ratejobs.management.input_files import add_file_arguments, input_format, opened_input
from ratejobs.management.messages import clause, refusal, validation_problems
from ratejobs.models import MAX_PRIORITY, Api, Job
from ratejobs.permissions import can_submit_jobs
from ratejobs.selectors.apis import api_list
from ratejobs.selectors.jobs import job_eta_seconds, job_outcome, job_paces
from ratejobs.text import duration_text
from ratejobs.uploads import UploadError, calls_from_upload, job_submit_from_file

BAR_WIDTH = 30
# Without a terminal (CI logs, pipes) a redrawn bar is noise: print a line this often instead.
PLAIN_LINE_EVERY = 10.0
EXIT_CALLS_NOT_ALL_SUCCEEDED = 1
EXIT_INTERRUPTED = 130  # what a shell reports for Ctrl-C


class Command(BaseCommand):
    help = (
        "Submit a job of calls from a CSV or JSONL file (or JSONL on standard input with "
        "--file -). With --wait, follow it to the end; the exit status is 0 only when every "
        "call succeeded."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--api", required=True, help="name of the API to call")
        add_file_arguments(parser, what="calls")
        parser.add_argument("--name", help="the job's name (default: the file's name)")
        parser.add_argument(
            "--owner",
            help="username the job belongs to; jobs are visible to their owner and to superusers "
            "(default: the only superuser when there is exactly one; with several it must be "
            "named, so that a job never belongs to someone by guesswork)",
        )
        parser.add_argument(
            "--priority", type=int, default=1,
            help=f"1-{MAX_PRIORITY}: a job of priority 2 gets twice the share of its API as one "
            "of priority 1 (default: 1)",
        )  # fmt: skip
        parser.add_argument(
            "--not-before", type=_moment, metavar="TIME",
            help="send nothing before this time, ISO 8601 with its zone (2026-12-01T08:00Z)",
        )  # fmt: skip
        parser.add_argument(
            "--deadline", type=_moment, metavar="TIME",
            help="cancel the calls not started by this time, ISO 8601 with its zone",
        )  # fmt: skip
        parser.add_argument(
            "--callback-url", default="", metavar="URL",
            help="POST the job's summary here, signed with the owner's signing key, when it "
            "finishes (see the README's Job callbacks)",
        )  # fmt: skip
        parser.add_argument(
            "--credential-key", default="", metavar="KEY",
            help="send the calls with this customer's credential of the API (its own secret and "
            "limiter bucket; see import_credentials); a call may name its own (credential_key)",
        )  # fmt: skip
        parser.add_argument(
            "--base-url", type=_base_url, metavar="URL",
            help="the web server's address as a browser reaches it (https://ratejobs.example.com), "
            "to print the admin's links whole; without it they are paths on that server",
        )  # fmt: skip
        parser.add_argument(
            "--wait", action="store_true", help="show progress until the job is done"
        )
        parser.add_argument(
            "--poll", type=float, default=1.0, help="seconds between progress reads (--wait)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        api = api_list().filter(name=options["api"]).first()
        if api is None:
            known = ", ".join(api_list().values_list("name", flat=True))
            raise CommandError(f"no API named {options['api']!r} (known: {known or 'none'})")
        owner = _owner(options["owner"])
        path = options["file"]
        fmt = input_format(path, options["format"])
        job = self._submit(api, owner, path, fmt, options)
        self.base_url = options["base_url"]
        admin = self._link(reverse("admin:ratejobs_job_change", args=[job.pk]))
        self.stdout.write(
            f"job {job.pk} submitted: {job.total} calls to {api.name} (admin: {admin})"
        )
        if options["wait"]:
            self._follow(job, options["poll"])

    def _link(self, path: str) -> str:
        """An admin page's address: whole with --base-url; else the path, said to be one, since
        the command cannot know the address browsers reach the web server at."""
        if self.base_url:
            return self.base_url + path
        return f"{path} on your ratejobs web server; --base-url gives the whole link"

    def _submit(self, api: Api, owner: Any, path: str, fmt: str, options: dict) -> Job:
        where = "standard input" if path == "-" else path
        with opened_input(path) as stream:
            return self._submit_from(api, owner, path, fmt, stream, where, options)

    def _submit_from(
        self, api: Api, owner: Any, path: str, fmt: str, stream: Any, where: str, options: dict
    ) -> Job:
        try:
            job, _ = job_submit_from_file(
                owner=owner,
                api=api,
                name=options["name"] or ("calls from standard input" if path == "-" else
                                         Path(path).name),
                priority=options["priority"],
                not_before=options["not_before"],
                deadline=options["deadline"],
                callback_url=options["callback_url"],
                credential_key=options["credential_key"],
                calls=calls_from_upload(f"calls.{fmt}", stream),
            )  # fmt: skip
            return job
        except UploadError as exc:  # every bad line of the file (up to a count), one a line
            problems = [clause(message) for message in exc.messages()]
            if len(problems) == 1:
                raise CommandError(
                    refusal(f"{where}: {problems[0]}", "nothing was stored")
                ) from None
            listed = "".join(f"\n  {problem}" for problem in problems)
            raise CommandError(f"{where}: nothing was stored, for these errors:{listed}") from None
        except ValidationError as exc:
            raise CommandError(refusal(validation_problems(exc), "nothing was stored")) from None
        except PermissionDenied as exc:
            raise CommandError(f"{exc} Nothing was stored.") from None
        except OSError as exc:  # the file went away or failed while being read
            raise CommandError(
                refusal(f"cannot read {where}: {exc}", "nothing was stored")
            ) from None
        except KeyboardInterrupt:  # the job's transaction has rolled back
            raise CommandError(
                f"interrupted while reading {where}; nothing was stored",
                returncode=EXIT_INTERRUPTED,
            ) from None

    def _follow(self, job: Job, poll: float) -> None:
        out = self.stderr  # the progress goes to stderr, the summary to stdout
        redraw = out.isatty()
        last_line_at = float("-inf")
        try:
            while True:
                job.refresh_from_db()
                final = job.status in (Job.Status.COMPLETED, Job.Status.CANCELLED)
                line = progress_line(job, job_paces([job]).get(job.pk, 0.0))
                if redraw:
                    out.write("\r" + line + "\033[K", _plain, ending="\n" if final else "")
                    out.flush()
                elif final or time.monotonic() - last_line_at >= PLAIN_LINE_EVERY:
                    out.write(line, _plain)
                    out.flush()
                    last_line_at = time.monotonic()
                if final:
                    break
                time.sleep(poll)
        except KeyboardInterrupt:
            admin = self._link(reverse("admin:ratejobs_job_change", args=[job.pk]))
            raise CommandError(
                f"stopped waiting; job {job.pk} keeps running (cancel it in the admin: {admin}; "
                f"or over REST with POST /api/jobs/{job.pk}/cancel/)",
                returncode=EXIT_INTERRUPTED,
            ) from None
        took = (job.finished - job.created).total_seconds() if job.finished else None
        self.stdout.write(
            f"job {job.pk} {outcome_text(job)}: {job.succeeded} succeeded, {job.failed} failed, "
            f"{job.cancelled} cancelled, {job.throttled} 429s, {job.retries} retries in "
            f"{duration_text(took)}"
        )
        if job.succeeded != job.total:
            raise CommandError(
                f"{job.total - job.succeeded} of {job.total} calls did not succeed; "
                f"{self._not_succeeded(job)}",
                returncode=EXIT_CALLS_NOT_ALL_SUCCEEDED,
            )

    def _not_succeeded(self, job: Job) -> str:
        """Where the calls that did not succeed are seen from here: a command, and the admin's
        list of the job's calls filtered to them."""
        ended = [status for status, count in (("failed", job.failed), ("cancelled", job.cancelled))
                 if count] or ["failed", "cancelled"]  # fmt: skip
        flags = " ".join(f"--status {status}" for status in ended)
        admin = self._link(calls_url(job.pk, status__exact=ended[0]))  # the job page's own link
        return (
            f"list them with: python manage.py export_results {job.pk} {flags} --format csv "
            f"--output job-{job.pk}-not-succeeded.csv (or see the {ended[0]} ones in the "
            f"admin: {admin})"
        )


def progress_line(job: Job, pace: float) -> str:
    done = job.done
    filled = round(BAR_WIDTH * done / job.total) if job.total else BAR_WIDTH
    return (
        f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {job.progress * 100:5.1f}% "
        f"{done}/{job.total}  ok {job.succeeded}  failed {job.failed}  429s {job.throttled}  "
        f"{pace:.1f}/s  ETA {duration_text(job_eta_seconds(job, pace))}  ({outcome_text(job)})"
    )


def outcome_text(job: Job) -> str:
    """The job's outcome in the admin's words ("completed with failures"), lower case as a
    line's last word: a job whose calls failed never reads as plainly completed."""
    return job_outcome(job).label.lower()


def _plain(text: str) -> str:
    """Progress on stderr, but not in the colour Django gives errors there."""
    return text


def _moment(text: str) -> datetime:
    """An ISO 8601 time with its zone (Z or an offset): a time without one would be read in
    whatever zone the server runs in."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no time zone: add Z or an offset")
    return moment


def _base_url(text: str) -> str:
    """An http(s) address without query or fragment, its trailing slash dropped (the admin's
    paths begin with one)."""
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an http:// or https:// address (https://ratejobs.example.com)"
        )
    return text.rstrip("/")


def _owner(username: str | None) -> Any:
    users = get_user_model().objects
    if username:
        owner = users.filter(username=username).first()
        if owner is None:
            raise CommandError(f"no user named {username!r}")
        if not can_submit_jobs(owner):  # the same role model as the admin and the REST API
            raise CommandError(f"user {username!r} is inactive and may not own new jobs")
        return owner
    superusers = list(users.filter(is_superuser=True, is_active=True)[:2])
    if len(superusers) != 1:
        raise CommandError(
            "say who owns the job with --owner USERNAME "
            f"({'no' if not superusers else 'more than one'} superuser to default to)"
        )
    return superusers[0]
