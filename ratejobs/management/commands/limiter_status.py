"""`manage.py limiter_status [NAME]`: the live state of the shared limiters, from Redis."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ratejobs.limiter import LimiterError, LimiterState, LimiterUnavailable
from ratejobs.limiter.buckets import KeyBuckets
from ratejobs.models import Api
from ratejobs.namespace import limiter_namespace
from ratejobs.selectors.apis import api_key_buckets, api_limiter_state, api_list
from ratejobs.text import window_text

# Each column's header and what it means, its unit included: the legend printed under the
# table, so that "10.92/1s" or "0/-" never has to be guessed.
LEGEND = (
    ("API", "the API's name"),
    ("RATE NOW", "requests per period the shared limiter lets through now (10.92/1s: 10.92 "
                 "a second; 5/60s: 5 a minute); below CEILING after 429s when ADAPTIVE"),
    ("CEILING", "the API's configured rate, requests per period: the most RATE NOW goes up to"),
    ("BURST", "requests that may go at once after a quiet spell"),
    ("ADAPTIVE", "\"min R\": 429s lower the rate, never below R requests per period; \"no\": "
                 "the rate stays at CEILING"),
    ("BLOCKED FOR", "seconds every worker waits before sending anything (a Retry-After, a "
                    "spent quota, a manual block); \"no\": not blocked"),
    ("NEXT SLOT IN", "seconds until the next request may go (0.000s: now)"),
    ("IN FLIGHT/CAP", "requests on the wire now, of the most allowed at once (max_concurrency); "
                      "\"0/-\": no cap, and without one nothing is counted"),
    ("GRANTS", "requests let through since the limiter's state was made or reset"),
    ("429s", "throttled responses (429, or 403 with a throttle hint) reported since then"),
    ("GENERATION", "goes up by one each time the schedule is remade (a burst of 429s, counted "
                   "once; a change of limits; a reset): compare two readings; it starts from "
                   "Redis' clock, so its size says nothing"),
    ("LEARNED LIMIT", "the API's real limit, requests per period, as the adaptive rate measured "
                      "it from 429s; \"-\": not measured yet"),
)  # fmt: skip
COLUMNS = tuple(header for header, _ in LEGEND)


class Command(BaseCommand):
    help = "Show each API's shared limiter as every worker sees it: rate, block, in flight."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", nargs="?", help="one API (default: all)")
        parser.add_argument("--json", action="store_true", help="one JSON document")
        parser.add_argument(
            "--no-legend", action="store_true",
            help="leave out the lines under the table that say what each column means",
        )  # fmt: skip

    def handle(self, *args: Any, **options: Any) -> None:
        apis = list(api_list().filter(name=options["name"]) if options["name"] else api_list())
        if options["name"] and not apis:
            raise CommandError(f"no API named {options['name']!r}")
        states = {api.name: _state(api) for api in apis}
        keys = {api.name: _key_buckets(api) for api in apis}
        if options["json"]:
            self.stdout.write(json.dumps(
                [{**_as_json(s), "namespace": limiter_namespace(),
                  "key_buckets": dataclasses.asdict(keys[name])}
                 for name, s in states.items()],
                indent=2,
            ))  # fmt: skip
            return
        if not states:
            self.stdout.write("no APIs yet: add one in the admin or with POST /api/apis/")
            self.stdout.write(_export_line())
            return
        rows = [COLUMNS, *(_row(api, states[api.name]) for api in apis)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
        for api, row in zip([None, *apis], rows, strict=True):
            line = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            if api is None:  # whose limiters these are, when deployments share one Redis
                line += f"  (namespace {limiter_namespace()})"
            self.stdout.write(line)
            # each further limit on a line of its own, under its API
            for window in _windows(states[api.name]) if api is not None else ():
                self.stdout.write(f"  limit {window.window.label}: {window_text(window)}")
            if api is not None and keys[api.name].live:
                self.stdout.write(f"  {_key_buckets_text(keys[api.name])}")
        if not options["no_legend"]:
            self.stdout.write(_legend())
        self.stdout.write(_export_line())


def _legend() -> str:
    """What each column means, one a line, under a blank line."""
    width = max(len(header) for header, _ in LEGEND)
    lines = [f"  {header.ljust(width)}  {meaning}" for header, meaning in LEGEND[1:]]
    return "\ncolumns (--no-legend leaves this out):\n" + "\n".join(lines)


def _export_line() -> str:
    """What a program of one's own (ratejobs.limiter, outside Django) exports to share these
    buckets when it does not run with this deployment's environment."""
    return (
        f"\nprograms elsewhere share these buckets with: "
        f"export RATEJOBS_LIMITER_NAMESPACE={limiter_namespace()}  (and this REDIS_URL)"
    )


def _key_buckets(api: Api) -> KeyBuckets:
    try:
        return api_key_buckets(api)
    except LimiterError as exc:
        raise CommandError(f"{api.name}: key buckets unreadable: {exc}", returncode=1) from None


def _key_buckets_text(buckets: KeyBuckets) -> str:
    """One line: how many credential keys have live buckets, and the most blocked or
    throttled of them."""
    live = f"{buckets.live}{'' if buckets.complete else '+'}"
    top = ", ".join(
        f"{b.key} ({f'blocked {b.blocked_for:.1f}s, ' if b.blocked_for else ''}{b.throttles} 429s)"
        for b in buckets.top
    )
    most = f"; most throttled: {top}" if top else ""
    return f"credential keys with live buckets: {live}{most}"


def _state(api: Api) -> LimiterState:
    try:
        return api_limiter_state(api)
    except LimiterUnavailable:
        # The limiter fails closed: nothing is sent while this lasts, so say it plainly.
        raise CommandError(
            "Redis cannot be reached (REDIS_URL): no limiter state, and workers send nothing "
            "until it is back",
            returncode=1,
        ) from None
    except LimiterError as exc:
        raise CommandError(f"{api.name}: limiter state unreadable: {exc}", returncode=1) from None


def _row(api: Api, state: LimiterState) -> tuple[str, ...]:
    name = api.name
    if not state.configured:
        return (name, "not configured in Redis (workers restore it at their next call)",
                *[""] * (len(COLUMNS) - 2))  # fmt: skip
    if state.config_version < api.limits_version:
        return (name, f"older limits in Redis (version {state.config_version}, the database's "
                f"is {api.limits_version}): workers write the database's at their next call",
                *[""] * (len(COLUMNS) - 2))  # fmt: skip
    per = f"/{state.period:g}s"
    cap = str(state.max_concurrency) if state.max_concurrency else "-"
    return (
        name,
        f"{state.current_rate:.4g}{per}",
        f"{state.rate:.4g}{per}",
        str(state.burst),
        f"min {state.min_rate:.3g}" if state.adaptive else "no",
        f"{state.blocked_for:.1f}s" if state.blocked_for else "no",
        f"{state.next_free_in:.3f}s",
        f"{state.in_flight}/{cap}",
        str(state.counts.grants),
        str(state.counts.throttles),
        str(state.generation),
        # the real limit the adaptive rate learned from throttles; "-" until it measured one
        "-" if state.learned_rate is None else f"{state.learned_rate:.4g}{per}",
    )


def _windows(state: LimiterState) -> tuple[Any, ...]:
    return state.windows if state.configured else ()


def _as_json(state: LimiterState) -> dict[str, Any]:
    return {
        **dataclasses.asdict(state),
        "blocked_for": state.blocked_for,
        "next_free_in": state.next_free_in,
        "windows": [
            {
                **dataclasses.asdict(window),
                "label": window.window.label,
                "text": window_text(window),
            }
            for window in _windows(state)
        ],
    }
