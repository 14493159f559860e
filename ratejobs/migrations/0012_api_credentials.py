"""Credentials per key (a quota per credential)."""

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

KEY_PATTERN = r"^[A-Za-z0-9_.-]{1,100}\Z"
KEY_MESSAGE = "a credential key is 1 to 100 of A-Z a-z 0-9 _ . -"


class Migration(migrations.Migration):
    dependencies = [("ratejobs", "0011_job_callback")]

    operations = [
        migrations.CreateModel(
            name="ApiCredential",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                (
                    "key",
                    models.CharField(
                        max_length=100,
                        validators=[
                            django.core.validators.RegexValidator(KEY_PATTERN, KEY_MESSAGE)
                        ],
                    ),
                ),
                ("credential_encrypted", models.TextField(editable=False)),
                ("created", models.DateTimeField(auto_now_add=True)),
                (
                    "api",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="credentials",
                        to="ratejobs.api",
                    ),
                ),
            ],
            options={"ordering": ["api", "key"]},
        ),
        migrations.AddConstraint(
            model_name="apicredential",
            constraint=models.UniqueConstraint(
                fields=("api", "key"), name="api_credential_unique_key"
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="credential_key",
            field=models.CharField(
                blank=True,
                db_default="",
                default="",
                max_length=100,
                validators=[django.core.validators.RegexValidator(KEY_PATTERN, KEY_MESSAGE)],
            ),
        ),
        migrations.AddField(
            model_name="call",
            name="credential_key",
            field=models.CharField(blank=True, db_default="", default="", max_length=100),
        ),
    ]
