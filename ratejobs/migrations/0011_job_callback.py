"""Job callbacks and signing keys (callback_url).

Every new Job column is nullable or has a constant default, which PostgreSQL adds without
rewriting the table."""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("ratejobs", "0010_job_schedule"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="callback_url",
            field=models.URLField(blank=True, max_length=2000),
        ),
        migrations.AddField(
            model_name="job",
            name="callback_status",
            field=models.CharField(
                blank=True,
                choices=[
                    ("pending", "Pending"),
                    ("sending", "Sending"),
                    ("delivered", "Delivered"),
                    ("failed", "Failed"),
                ],
                editable=False,
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="callback_delivery",
            field=models.UUIDField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="callback_attempts",
            field=models.PositiveIntegerField(default=0, editable=False),
        ),
        migrations.AddField(
            model_name="job",
            name="callback_last_error",
            field=models.TextField(blank=True, editable=False),
        ),
        migrations.AddField(
            model_name="job",
            name="callback_next_attempt_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="callback_claimed_until",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="job",
            name="callback_delivered_at",
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.CreateModel(
            name="SigningKey",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("secret_encrypted", models.TextField(editable=False)),
                ("created", models.DateTimeField(help_text="when the current secret was made")),
                (
                    "rotated",
                    models.DateTimeField(
                        blank=True,
                        help_text="when the secret was last replaced; null: never",
                        null=True,
                    ),
                ),
                (
                    "user",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="signing_key",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
        ),
    ]
