"""Log formats: readable text by default, or one JSON object per line for log pipelines
(RATEJOBS_LOG_FORMAT=json). The fields a throttle decision carries (api, job_id, call_id...)
are passed as `extra`, so JSON lines have them as keys and text lines in the message."""

from __future__ import annotations

import logging

from pythonjsonlogger.json import JsonFormatter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
# Keys every JSON line has; a record's `extra` fields are added beside them.
JSON_FIELDS = ("asctime", "levelname", "name", "message")


def json_formatter() -> logging.Formatter:
    return JsonFormatter(list(JSON_FIELDS), rename_fields={"asctime": "time", "levelname": "level"})


def formatter_for(log_format: str) -> logging.Formatter:
    return json_formatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def logging_config(*, log_format: str, level: str) -> dict:
    """Django's LOGGING: our loggers at `level`, through the root logger's console handler
    (which a Celery worker replaces with its own, keeping our records)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"ratejobs": {"()": "ratejobs.logs.formatter_for", "log_format": log_format}},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "ratejobs"}},
        "root": {"handlers": ["console"], "level": "WARNING"},
        "loggers": {"ratejobs": {"level": level}},
    }
