"""`manage.py import_credentials --api NAME --file creds.csv`: customers' credentials for an API
from a CSV (header row `key,secret`) or JSONL file (`{"key": ..., "secret": ...}` a line), all or
nothing. Secrets come from the file (or standard input), never from the command line, where
`ps` and shell histories would show them."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from typing import IO, Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from ratejobs.management.input_files import add_file_arguments, input_format, opened_input
from ratejobs.management.messages import refusal
from ratejobs.selectors.apis import api_list
from ratejobs.services.credentials import MAX_CREDENTIALS_PER_REQUEST, credentials_add


class Command(BaseCommand):
    help = (
        "Import customers' credentials (key, secret) for an API from a CSV file with a header "
        'row key,secret or a JSONL file of {"key", "secret"} objects; all or nothing.'
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--api", required=True, help="name of the API")
        add_file_arguments(parser, what="credentials")
        parser.add_argument(
            "--replace", action="store_true",
            help="give keys that exist already the file's secret (default: refuse them)",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        api = api_list().filter(name=options["api"]).first()
        if api is None:
            raise CommandError(f"no API named {options['api']!r}")
        fmt = input_format(options["file"], options["format"])
        added = 0
        try:
            with opened_input(options["file"]) as stream, transaction.atomic():
                batch: list[tuple[str, str]] = []
                for pair in _pairs(stream, fmt):
                    batch.append(pair)
                    if len(batch) >= MAX_CREDENTIALS_PER_REQUEST:
                        added += credentials_add(api=api, items=batch, replace=options["replace"])
                        batch = []
                if batch or not added:
                    added += credentials_add(api=api, items=batch, replace=options["replace"])
        except ValidationError as exc:
            # by item number within its batch, never a secret
            raise CommandError(refusal(*exc.messages, "nothing was stored")) from None
        except ValueError as exc:
            raise CommandError(refusal(str(exc), "nothing was stored")) from None
        self.stdout.write(f"{added} credentials stored for {api.name} (encrypted)")


def _pairs(stream: IO[bytes], fmt: str) -> Iterator[tuple[str, str]]:
    text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
    try:
        if fmt == "csv":
            reader = csv.DictReader(text)
            if reader.fieldnames is None or set(reader.fieldnames) != {"key", "secret"}:
                raise ValueError("the CSV needs a header row naming exactly: key,secret")
            for line, row in enumerate(reader, start=2):
                if None in row or row["key"] is None or row["secret"] is None:
                    raise ValueError(f"line {line}: two cells, key and secret")
                yield row["key"], row["secret"]
            return
        for line, raw in enumerate(text, start=1):
            if not raw.strip():
                continue
            try:
                item = json.loads(raw)
            except ValueError:
                raise ValueError(f"line {line}: not a JSON object") from None
            if not isinstance(item, dict) or set(item) != {"key", "secret"}:
                raise ValueError(f'line {line}: an object of exactly "key" and "secret"')
            yield item["key"], item["secret"]
    finally:
        text.detach()
