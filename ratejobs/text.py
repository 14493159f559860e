"""How figures read wherever people see them (the admin, the command line, the REST API's
notes): rates, spans and moments, an API's limits and in-flight calls, a throttle event in
words. Formatting only: values in, text out, no database reads."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from django.utils import timezone

from ratejobs.models import Call, ThrottleEvent

if TYPE_CHECKING:
    from ratejobs.limiter import LimiterState
    from ratejobs.limiter.core import WindowState


def rate_text(per_second: float | None) -> str:
    """A rate as people read it: "12.3/s", "0.25/s" below one a second, "1250/s"; — for none."""
    if per_second is None:
        return "—"
    if per_second >= 1000:
        return f"{per_second:.0f}/s"
    if per_second >= 1 or per_second == 0:
        return f"{per_second:.1f}/s"
    return f"{per_second:.2f}/s"


def seconds_text(seconds: float | None) -> str:
    """A short span with a tenth of a second below ten seconds ("4.2 s"), else duration_text;
    under a second in milliseconds ("850 ms")."""
    if seconds is None:
        return "—"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return f"{seconds:.1f} s" if seconds < 10 else duration_text(seconds)


def duration_text(seconds: float | None) -> str:
    """An ETA or a duration as people read it: 2 h 05 min, 3 min 07 s, 12 s; — for none."""
    if seconds is None:
        return "—"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {seconds:02d} s"
    return f"{seconds} s"


def moment_text(moment: datetime | None) -> str:
    """A time in the admin's local time, to the second: "2026-11-24 14:03:27"; — for none."""
    return "—" if moment is None else timezone.localtime(moment).strftime("%Y-%m-%d %H:%M:%S")


def clock_text(moment: datetime) -> str:
    """A time of day in the admin's local time, to the second: "14:03:27"."""
    return timezone.localtime(moment).strftime("%H:%M:%S")


# A window that takes this long to refill says when, as a clock time, too.
REFILL_CLOCK_AFTER = 3600.0


def window_text(state: WindowState) -> str:
    """One of an API's limits as an operator reads it: "300 per 60 s (burst 10): 212 left, full
    in 41 s" ("90000 cost per 60 s ..." for a cost window): what may go now, and when the
    whole quota is back."""
    window = state.window
    unit = " cost" if window.unit == "cost" else ""
    left = max(0, math.floor(state.remaining))
    text = f"{window.rate:g}{unit} per {window.period:g} s (burst {window.burst}): {left} left"
    if left < 1:
        text += f", next in {seconds_text(state.next_free_in)}"
    if state.full_in <= 0:
        return text + ", full"
    text = f"{text}, full in {seconds_text(state.full_in)}"
    if state.full_in >= REFILL_CLOCK_AFTER:  # a day's quota: when, as a time of day
        at = datetime.now(UTC) + timedelta(seconds=state.full_in)
        text += f" (at {at:%H:%M} UTC)"
    return text


def in_flight_text(state: LimiterState) -> str:
    """Calls on the wire against the cap: "3 of 10"; without a cap no lease is taken, so
    nothing is counted (docs/limiter.md, L1)."""
    if state.max_concurrency:
        return f"{state.in_flight} of {state.max_concurrency}"
    return "not counted (no cap)"


def throttle_event_text(event: ThrottleEvent, *, period: float) -> str:
    """One row of throttle_event_story_for_job in words, rates per second (the limiter keeps
    them per `period`): "429 received · Retry-After 1.0 s · rate 20.0/s → 14.0/s"."""
    if event.kind == ThrottleEvent.Kind.BLOCKED:
        return f"manual block for {seconds_text(event.retry_after or 0.0)} by an operator"
    # a spent quota's row carries the rates of the cut folded into it; a 429's, its own
    cut = getattr(event, "cut_after", None) is not None
    before = event.cut_before if cut else event.rate_before
    after = event.cut_after if cut else event.rate_after
    parts = []
    if event.kind == ThrottleEvent.Kind.THROTTLED:
        parts.append(f"{event.status_code or 429} received")
        if event.retry_after:
            parts.append(f"Retry-After {seconds_text(event.retry_after)}")
    elif event.kind == ThrottleEvent.Kind.QUOTA_EXHAUSTED:
        parts.append("quota used up (rate limit headers)")
        if event.retry_after:
            parts.append(f"blocked {seconds_text(event.retry_after)}")
    else:
        parts.append("rate decreased")
    if before is not None and after is not None:
        if after < before:
            parts.append(f"rate {rate_text(before / period)} → {rate_text(after / period)}")
        else:
            parts.append(f"rate {rate_text(after / period)} (unchanged)")
    return " · ".join(parts)


def response_removed_text(call: Call) -> str | None:
    """What a page shows instead of a body retention removed (RATEJOBS_KEEP_BODIES_DAYS), so
    that it never reads as a call that got nothing back; None when it was not removed."""
    removed = call.response_removed_at
    if removed is None:
        return None
    days = (removed - (call.finished or removed)).days
    return f"removed after {days} day{'' if days == 1 else 's'} (retention)"
