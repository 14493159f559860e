"""What the commands that read a CSV or JSONL file (submit_job, import_credentials) share: the
--file and --format options, the format a path implies, and opening the file or standard
input."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from django.core.management.base import CommandError, CommandParser

FORMATS = ("csv", "jsonl")


def add_file_arguments(parser: CommandParser, *, what: str) -> None:
    parser.add_argument(
        "--file", required=True, help=f"{what} file, .csv or .jsonl; - for standard input"
    )
    parser.add_argument(
        "--format", choices=FORMATS,
        help="the file's format (default: from its extension; jsonl for standard input)",
    )  # fmt: skip


def input_format(path: str, given: str | None) -> str:
    """--format, else what the path's extension says (jsonl for standard input)."""
    fmt = given or ("jsonl" if path == "-" else Path(path).suffix.lstrip("."))
    if fmt not in FORMATS:
        raise CommandError(
            f"unsupported file type {fmt or 'without an extension'}: give a .csv or .jsonl "
            "file, or --format"
        )
    return fmt


@contextmanager
def opened_input(path: str) -> Iterator[IO[bytes]]:
    """The file at `path` ("-": standard input, left open), as bytes."""
    if path == "-":
        yield sys.stdin.buffer
        return
    try:
        stream = open(path, "rb")  # noqa: SIM115
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror}") from None
    with stream:
        yield stream
