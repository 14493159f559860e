"""`manage.py api_limits NAME [--rate R --period P --burst B] [--limit RATE/PERIOD[/BURST][:cost]
...] [--no-limits]`: show an API's limits, or change them live (workers take them at their next
grant), as the admin's API page and PATCH /api/apis/{name}/ do."""

from __future__ import annotations

import argparse
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from ratejobs.management.messages import refusal, validation_problems
from ratejobs.models import Api, api_windows
from ratejobs.selectors.apis import api_list
from ratejobs.services.apis import api_update


def limit_argument(text: str) -> dict[str, Any]:
    """RATE/PERIOD[/BURST][:cost] as a window of Api.limits (burst defaults to 1, as the main
    rate's does; :cost counts each call's cost instead of requests)."""
    spec, _, unit = text.partition(":")
    parts = spec.split("/")
    try:
        if len(parts) not in (2, 3) or unit not in ("", "cost"):
            raise ValueError
        window = {"rate": float(parts[0]), "period": float(parts[1])}
        window["burst"] = int(parts[2]) if len(parts) == 3 else 1
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give RATE/PERIOD[/BURST][:cost], e.g. 300/60/10 or 90000/60/90000:cost"
        ) from None
    window["unit"] = "cost" if unit else "requests"
    return window


class Command(BaseCommand):
    help = (
        "Show an API's limits, or change them: the main rate and its windows (each grant must "
        "fit every window). Workers take a change at their next grant."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="the API")
        parser.add_argument("--rate", type=float, help="requests per period")
        parser.add_argument("--period", type=float, help="seconds")
        parser.add_argument("--burst", type=int)
        limits = parser.add_mutually_exclusive_group()
        limits.add_argument(
            "--limit", type=limit_argument, action="append", dest="limits",
            help="a window RATE/PERIOD[/BURST][:cost], repeatable; replaces the API's windows",
        )  # fmt: skip
        limits.add_argument(
            "--no-limits", action="store_true", help="remove every window besides the rate"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        changes = {k: options[k] for k in ("rate", "period", "burst") if options[k] is not None}
        if options["limits"] is not None:
            changes["limits"] = options["limits"]
        elif options["no_limits"]:
            changes["limits"] = []
        try:
            with transaction.atomic():
                api = api_list().select_for_update().filter(name=options["name"]).first()
                if api is None:
                    raise CommandError(f"no API named {options['name']!r}")
                if changes:
                    api = api_update(api=api, **changes)
        except ValidationError as exc:
            raise CommandError(refusal(validation_problems(exc), "nothing was changed")) from None
        if changes:
            self.stdout.write(f"{api.name}: limits changed (version {api.limits_version})")
        self.stdout.write(limits_text(api))


def limits_text(api: Api) -> str:
    lines = [f"{api.name}: {api.rate:g} per {api.period:g} s (burst {api.burst})"]
    for window in api_windows(api.limits):
        unit = " cost" if window.unit == "cost" else ""
        lines.append(f"  and {window.rate:g}{unit} per {window.period:g} s (burst {window.burst})")
    return "\n".join(lines)
