"""A job callback's body, built as the job finishes and stored with its delivery.

The column has a constant default, which PostgreSQL adds without rewriting the table. A delivery
made before has an empty body and is built when sent, as it was; one of a job that has run
again since (its failed calls retried) would announce a finish that no longer holds, so it is
superseded here, as services.callbacks.job_callback_supersede does from now on."""

from django.db import migrations, models

# services.callbacks.SUPERSEDED as of this migration (a migration keeps its own copy)
SUPERSEDED = (
    "superseded: the job ran again (its failed calls retried) before this delivery went out; "
    "its next finish sends a new one"
)


def supersede_deliveries_of_unfinished_jobs(apps, schema_editor):
    Job = apps.get_model("ratejobs", "Job")
    Job.objects.filter(callback_status__in=("pending", "sending")).exclude(
        status__in=("completed", "cancelled")
    ).update(
        callback_status="failed",
        callback_last_error=SUPERSEDED,
        callback_next_attempt_at=None,
        callback_claimed_until=None,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("ratejobs", "0013_api_limits"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="callback_body",
            field=models.TextField(blank=True, editable=False),
        ),
        migrations.RunPython(supersede_deliveries_of_unfinished_jobs, migrations.RunPython.noop),
    ]
