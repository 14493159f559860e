"""Several limits per API, call cost (tokens)."""

import django.core.validators
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("ratejobs", "0012_api_credentials")]

    # Columns with constant defaults (PostgreSQL 11+ adds them without rewriting the calls
    # table) and a nullable one; Call.cost keeps its default in the database.
    operations = [
        migrations.AddField(
            model_name="api",
            name="limits",
            field=models.JSONField(
                blank=True,
                default=list,
                help_text='more windows every call must fit, e.g. [{"rate": 10000, "period": '
                '86400, "burst": 1000}]; "unit": "cost" counts each call\'s cost (tokens) '
                "instead of requests",
            ),
        ),
        migrations.AddField(
            model_name="api",
            name="cost_header",
            field=models.CharField(
                blank=True,
                help_text="response header carrying the call's actual cost (e.g. "
                "X-Tokens-Used); empty: none",
                max_length=100,
            ),
        ),
        migrations.AddField(
            model_name="api",
            name="cost_json_field",
            field=models.CharField(
                blank=True,
                help_text="dotted path to the actual cost in a JSON response (e.g. "
                "usage.total_tokens); empty: none",
                max_length=200,
            ),
        ),
        migrations.AddField(
            model_name="call",
            name="cost",
            field=models.PositiveIntegerField(
                db_default=0,
                default=0,
                help_text="estimated cost (tokens)",
                validators=[django.core.validators.MaxValueValidator(1000000000)],
            ),
        ),
        migrations.AddField(
            model_name="call",
            name="cost_used",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="cost the last response reported; null: none reported",
                null=True,
            ),
        ),
    ]
