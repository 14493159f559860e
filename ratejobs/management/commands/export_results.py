"""`manage.py export_results JOB --format jsonl|csv [--status STATUS] [--output FILE]`: a job's
results file, the same rows as `GET /api/jobs/{id}/results.jsonl` and `.csv`, streamed to stdout
or a file; --status keeps only the calls that ended so (the failed ones, say)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ratejobs.models import Call, Job
from ratejobs.selectors.results import RESULT_FIELDS, RESULTS_FORMATS, job_results


class Command(BaseCommand):
    help = (
        "Write a job's results, every call in index order (" + ", ".join(RESULT_FIELDS) + "), "
        "as JSON lines or CSV, to stdout or --output, in constant memory."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_id", type=int, metavar="JOB", help="the job's id")
        parser.add_argument("--format", choices=sorted(RESULTS_FORMATS), default="jsonl")
        parser.add_argument(
            "--status", action="append", choices=Call.Status.values, default=[],
            help="only the calls with this status; repeat it for several (--status failed "
            "--status cancelled: every call that did not succeed); default: every call",
        )  # fmt: skip
        parser.add_argument("--output", type=Path, help="a file to write (default: stdout)")

    def handle(self, *args: Any, **options: Any) -> None:
        # The command runs on the server as its operator (as purge_job does): any job but one
        # being purged, which is gone from every route already.
        job = Job.objects.filter(pk=options["job_id"], purge_started__isnull=True).first()
        if job is None:
            raise CommandError(f"job {options['job_id']}: no such job", returncode=1)
        pieces = job_results(job, options["format"], options["status"])
        if options["output"] is not None:
            with options["output"].open("wb") as out:
                out.writelines(pieces)
            return
        # Bytes straight to the terminal's or pipe's buffer when there is one; a text stream
        # (call_command's stdout=StringIO) gets text.
        binary = getattr(self.stdout, "buffer", None)
        if binary is not None:
            self.stdout.flush()
            binary.writelines(pieces)
            binary.flush()
            return
        for piece in pieces:
            self.stdout.write(piece.decode(), ending="")
