"""`manage.py purge_job ID [ID ...]`: delete finished jobs for good, with their calls, throttle
events and counts, in batches; run again, it finishes a purge left half-done."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ratejobs.models import Job
from ratejobs.services.retention import BATCH_ROWS, JobPurgeRefused, Removed, job_purge

# A line of progress this often on a large job, so a long purge is visibly alive.
PROGRESS_SECONDS = 10.0


class Command(BaseCommand):
    help = (
        "Purge completed or cancelled jobs: the job, its calls (with their response bodies), "
        "throttle events and per-second counts, deleted in short transactions of --batch-size "
        "rows. A job still queued, running or paused is refused (exit status 1)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job_ids", nargs="+", type=int, metavar="ID", help="job ids")
        parser.add_argument(
            "--batch-size", type=int, default=BATCH_ROWS,
            help=f"rows per transaction (default {BATCH_ROWS:,})",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        if options["batch_size"] < 1:
            raise CommandError("--batch-size must be at least 1")
        refused = []
        for job_id in options["job_ids"]:
            job = Job.objects.filter(pk=job_id).first()
            if job is None:
                refused.append(f"job {job_id}: no such job (purged already?)")
                continue
            try:
                removed = self._purge(job, options["batch_size"])
            except JobPurgeRefused as exc:
                refused.append(f"job {job_id}: {exc}")
                continue
            self.stdout.write(
                f"job {job_id} purged: {removed.rows:,} rows in {removed.batches:,} batches "
                f"(longest {removed.longest_batch:.3f} s)"
            )
        if refused:
            raise CommandError("\n".join(refused), returncode=1)

    def _purge(self, job: Job, batch_size: int) -> Removed:
        removed = Removed()
        while True:
            part = job_purge(
                job=job, batch_size=batch_size, deadline=time.monotonic() + PROGRESS_SECONDS
            )
            removed.merge(part)
            if part.done:
                return removed
            self.stdout.write(f"job {job.pk}: {removed.rows:,} rows deleted so far")
