"""A job's API limiter as the job page shows it: the rate it granted over the job's run, when it
was blocked and why, and whether it is blocked now."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db.models import F, Q, QuerySet, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from ratejobs.limiter import LimiterError
from ratejobs.models import Job, JobPause, ThrottleEvent
from ratejobs.selectors.apis import api_limiter_state, api_rate_history
from ratejobs.selectors.jobs import Timeline, job_is_final, job_timeline
from ratejobs.text import clock_text, seconds_text

# What stops every call of an API for a while, with the seconds in `retry_after`: an
# operator's block, a 429's Retry-After (or the limiter's default pause after a 429), a quota
# the rate limit headers said was spent.
BLOCKING_KINDS = (
    ThrottleEvent.Kind.BLOCKED,
    ThrottleEvent.Kind.THROTTLED,
    ThrottleEvent.Kind.QUOTA_EXHAUSTED,
)
# Blocks that began this long before the job started may still have held its first calls.
BLOCKS_BEFORE_START = timedelta(hours=1)
# A chart never reads more events than this for its blocks (the newest) or its rate cuts: a
# long job at war with its API can have tens of thousands of 429s, and their blocks overlap
# into far fewer shaded spans.
MAX_CHART_EVENTS = 5000
# The rate line keeps at most this many steps (about one per two pixels of the chart), each
# bin keeping its lowest rate, so a cut is never smoothed away.
MAX_RATE_STEPS = 360
# The banner looks for the block that explains the limiter's among this many newest ones.
RECENT_BLOCKS = 20
# Rate changes written with 429s and rate cuts: the rate line's fallback before the limiter
# kept samples of its own.
RATE_EVENT_KINDS = (ThrottleEvent.Kind.THROTTLED, ThrottleEvent.Kind.RATE_DECREASED)


# Who caused a block, as the job page tells them apart: a 429 (or spent quota) of this job's
# own calls, one of another job's on the same API, or an operator.
OWN, OTHER_JOB, OPERATOR = "own", "other_job", "operator"


@dataclass(frozen=True)
class BlockSpan:
    """A stretch of the chart when no call of the API could be sent, in seconds from its start;
    `own`: caused by this job's own responses, not by another job or an operator."""

    start: float
    end: float
    title: str
    own: bool = True


@dataclass(frozen=True)
class PauseSpan:
    """A stretch of the chart when the job sat paused (nothing of it was sent, whatever the
    API allowed), in seconds from its start."""

    start: float
    end: float
    title: str


@dataclass(frozen=True)
class JobChart:
    """What the job page's chart draws: calls/s and 429s per bucket (the timeline), the rate the
    limiter granted as steps of (seconds from start, calls/s), its ceiling, and its blocks."""

    timeline: Timeline
    span_seconds: float
    ceiling_per_second: float
    adaptive: bool
    rate_steps: list[tuple[float, float]]
    rate_source: str  # where rate_steps come from, said in the chart's legend
    blocks: list[BlockSpan]
    # Seconds of the chart the API was blocked, by cause (OWN, OTHER_JOB, OPERATOR), each the
    # union of its blocks: a job with no 429 of its own can still have waited out others'.
    blocked_seconds: dict[str, float]
    # 429s of this job's own calls over the chart
    own_throttles: int
    # When the job was paused: a gap in its bars that no block explains
    pauses: list[PauseSpan] = field(default_factory=list)

    @property
    def start(self) -> datetime:
        return self.timeline.start


@dataclass(frozen=True)
class BlockNotice:
    """The job's API is blocked now: until when and why."""

    until: datetime
    for_seconds: float
    reason: str
    api_name: str

    @property
    def text(self) -> str:
        return (
            f"The API “{self.api_name}” is blocked until {clock_text(self.until)} "
            f"(for {seconds_text(self.for_seconds)} more): {self.reason}. "
            "No call is sent until then."
        )

    def as_json(self) -> dict:
        return {
            # which block this is (to the second: until is read afresh from the limiter each
            # time): the job page redraws its chart when the key it shows changes
            "key": f"{clock_text(self.until)}|{self.reason}",
            "until": clock_text(self.until),
            "for_seconds": round(self.for_seconds, 1),
            "reason": self.reason,
            "text": self.text,
        }


def block_reason_text(event: ThrottleEvent | None, *, job: Job | None = None) -> str:
    """Why an API was blocked, from the event that blocked it: "manual block by an operator",
    "Retry-After 5.0 s from a 429 on call 17" (the call's index in its job; "of job 12" when
    it is another job of `job`'s owner, "of another user's job" when it is not theirs: its id
    would tell them which jobs exist)."""
    if event is None:
        return "reason not recorded"
    if event.kind == ThrottleEvent.Kind.BLOCKED:
        return "manual block by an operator"
    call = ""
    index = getattr(event, "call_index", None)
    if index is not None:
        call = f" on call {index}"
        if job is None or event.job_id != job.pk:
            same_owner = job is not None and getattr(event, "job_owner_id", None) == job.owner_id
            call += f" of job {event.job_id}" if same_owner else " of another user's job"
    wait = seconds_text(event.retry_after) if event.retry_after else "a pause"
    if event.kind == ThrottleEvent.Kind.QUOTA_EXHAUSTED:
        return f"quota used up (rate limit headers){call}: blocked {wait}"
    return f"Retry-After {wait} from a {event.status_code or 429}{call}"


def blocking_events(api_id: int) -> QuerySet[ThrottleEvent]:
    """Events that blocked the API, newest first, with their call's index."""
    return (
        ThrottleEvent.objects.filter(api_id=api_id, kind__in=BLOCKING_KINDS)
        .exclude(retry_after__isnull=True)
        .annotate(call_index=F("call__index"), job_owner_id=F("job__owner_id"))
        .order_by("-created", "-pk")
    )


def job_block_notice(job: Job) -> BlockNotice | None:
    """The block holding the job's API now, if any; None when it is not blocked, when the job
    is final, or when Redis cannot be read (the page works on without the banner)."""
    if job_is_final(job):
        return None
    try:
        blocked_for = api_limiter_state(job.api).blocked_for
    except LimiterError:
        return None
    if blocked_for <= 0:
        return None
    # The clock time on the web server's clock: Redis's may differ, its remaining seconds do not.
    until = timezone.now() + timedelta(seconds=blocked_for)
    reason = block_reason_text(block_holding_until(job.api_id, until), job=job)
    return BlockNotice(until=until, for_seconds=blocked_for, reason=reason, api_name=job.api.name)


def block_holding_until(api_id: int, until: datetime) -> ThrottleEvent | None:
    """Of the API's newest blocks, the one whose end is nearest `until`: a 1 s pause after a 429
    during an operator's 60 s block does not explain why the API is blocked for a minute."""
    return blocks_holding_until({api_id: until})[api_id]


def blocks_holding_until(ends: dict[int, datetime]) -> dict[int, ThrottleEvent | None]:
    """block_holding_until for several APIs (API id -> when its block ends) in one query."""
    if not ends:
        return {}
    newest_first = Window(
        RowNumber(), partition_by=[F("api_id")], order_by=[F("created").desc(), F("pk").desc()]
    )
    recent = (
        ThrottleEvent.objects.filter(api_id__in=ends, kind__in=BLOCKING_KINDS)
        .exclude(retry_after__isnull=True)
        .annotate(call_index=F("call__index"), job_owner_id=F("job__owner_id"), newest=newest_first)
        .filter(newest__lte=RECENT_BLOCKS)
    )
    by_api: dict[int, list[ThrottleEvent]] = {api_id: [] for api_id in ends}
    for event in recent:
        by_api[event.api_id].append(event)
    return {
        api_id: min(
            events,
            key=lambda event, until=ends[api_id]: abs(
                _offset(event.created, until) + event.retry_after
            ),
            default=None,
        )
        for api_id, events in by_api.items()
    }


def job_chart(job: Job) -> JobChart | None:
    """The job's chart; None before it starts."""
    timeline = job_timeline(job)
    if timeline is None:
        return None
    span = len(timeline.calls_per_second) * timeline.bucket_seconds
    end = min(job.finished or timezone.now(), timeline.start + timedelta(seconds=span))
    ceiling = job.api.rate / job.api.period
    steps, source = _rate_steps(job, timeline.start, end, ceiling)
    blocks, blocked_seconds = _block_spans(job, timeline.start, end)
    return JobChart(
        timeline=timeline,
        span_seconds=span,
        ceiling_per_second=ceiling,
        adaptive=job.api.adaptive,
        rate_steps=steps,
        rate_source=source,
        blocks=blocks,
        blocked_seconds=blocked_seconds,
        own_throttles=sum(timeline.throttled),
        pauses=_pause_spans(job, timeline.start, end),
    )


def _pause_spans(job: Job, start: datetime, end: datetime) -> list[PauseSpan]:
    """The job's pauses over the chart, oldest first; one still open runs to the chart's end."""
    pauses = (
        JobPause.objects.filter(job=job, started__lte=end)
        .filter(Q(ended__isnull=True) | Q(ended__gte=start))
        .order_by("started", "pk")
        .values_list("started", "ended")[:MAX_CHART_EVENTS]
    )
    length = _offset(end, start)
    spans = []
    for began, ended in pauses:
        begin, finish = max(_offset(began, start), 0.0), min(_offset(ended or end, start), length)
        if finish < begin:
            continue
        if ended is None:
            title = f"paused since {clock_text(began)} ({seconds_text(finish - begin)} so far)"
        else:
            title = (
                f"paused {clock_text(began)} → {clock_text(ended)} "
                f"({seconds_text((ended - began).total_seconds())})"
            )
        spans.append(PauseSpan(start=begin, end=finish, title=title))
    return spans


def _offset(moment: datetime, start: datetime) -> float:
    return (moment - start).total_seconds()


def _rate_steps(
    job: Job, start: datetime, end: datetime, ceiling: float
) -> tuple[list[tuple[float, float]], str]:
    """The granted rate as (seconds from start, calls/s) from the limiter's own samples; without
    them, from the rate cuts the throttle events recorded (the ceiling until the first); a
    fixed-rate API grants its ceiling."""
    length = _offset(end, start)
    if not job.api.adaptive:
        return [(0.0, ceiling), (length, ceiling)], "fixed rate"
    samples = api_rate_history(job.api, since=job.started or start)
    points = [
        (_offset(datetime.fromtimestamp(sample.at, UTC), start), sample.rate_per_second)
        for sample in samples
    ]
    points = [(t, rate) for t, rate in points if t <= length]  # none after the job ended
    source = "adaptive rate"
    if not points:
        source = "adaptive rate (from rate cuts)"
        events = (
            ThrottleEvent.objects.filter(
                api_id=job.api_id,
                kind__in=RATE_EVENT_KINDS,
                created__gte=start,
                created__lte=end,
                rate_after__isnull=False,
            )
            .order_by("created", "pk")
            .values_list("created", "rate_before", "rate_after")[:MAX_CHART_EVENTS]
        )
        period = job.api.period
        for created, before, after in events:
            if not points:
                points.append((0.0, before / period))
            points.append((_offset(created, start), after / period))
        if not points:
            points.append((0.0, ceiling))
    points = [(max(0.0, min(t, length)), rate) for t, rate in points]
    points = _fewer_steps(points, length)
    return [*points, (length, points[-1][1])], source


def _fewer_steps(points: list[tuple[float, float]], length: float) -> list[tuple[float, float]]:
    """At most MAX_RATE_STEPS points: within each bin of time, its lowest rate."""
    if len(points) <= MAX_RATE_STEPS:
        return points
    bins: dict[int, tuple[float, float]] = {}
    for t, rate in points:
        key = min(int(t / max(length, 1e-9) * MAX_RATE_STEPS), MAX_RATE_STEPS - 1)
        if key not in bins or rate < bins[key][1]:
            bins[key] = (t, rate)
    return [bins[key] for key in sorted(bins)]


def block_cause(event: ThrottleEvent, job: Job) -> str:
    """OWN, OTHER_JOB or OPERATOR: who made the API wait with this event."""
    if event.kind == ThrottleEvent.Kind.BLOCKED:
        return OPERATOR
    return OWN if event.job_id == job.pk else OTHER_JOB


def _block_spans(
    job: Job, start: datetime, end: datetime
) -> tuple[list[BlockSpan], dict[str, float]]:
    """The API's blocks over the chart, overlapping ones of the same side (this job's own, or
    others') joined into one span; and the seconds blocked by each cause."""
    events = list(
        blocking_events(job.api_id).filter(
            created__gte=start - BLOCKS_BEFORE_START, created__lte=end
        )[:MAX_CHART_EVENTS]
    )
    events.reverse()  # oldest first
    length = _offset(end, start)
    # (from, to, events) in seconds, per side: an own 429 inside another job's block stays
    # visible as its own span rather than being taken into the other's title.
    groups: dict[bool, list[tuple[float, float, list[ThrottleEvent]]]] = {True: [], False: []}
    intervals: dict[str, list[tuple[float, float]]] = {OWN: [], OTHER_JOB: [], OPERATOR: []}
    for event in events:
        begin = _offset(event.created, start)
        finish = begin + event.retry_after
        if finish <= 0:
            continue
        cause = block_cause(event, job)
        intervals[cause].append((begin, finish))
        side = groups[cause == OWN]
        if side and begin <= side[-1][1]:
            first, last, joined = side[-1]
            joined.append(event)
            side[-1] = (first, max(last, finish), joined)
        else:
            side.append((begin, finish, [event]))
    spans = [
        _block_span(job, start, begin, finish, joined, length, own=own)
        for own, side in groups.items()
        for begin, finish, joined in side
    ]
    spans.sort(key=lambda span: (span.start, not span.own))
    seconds = {cause: _covered(spans_of, length) for cause, spans_of in intervals.items()}
    return spans, seconds


def _covered(intervals: list[tuple[float, float]], length: float) -> float:
    """Seconds of [0, length] inside any of the intervals (overlaps counted once)."""
    total, reached = 0.0, 0.0
    for begin, finish in sorted(intervals):
        begin, finish = max(begin, reached, 0.0), min(finish, length)
        if finish > begin:
            total += finish - begin
            reached = finish
    return round(total, 3)  # offsets in float seconds: 10 s must not read 9.999… s


def _block_span(
    job: Job,
    start: datetime,
    begin: float,
    finish: float,
    joined: list[ThrottleEvent],
    length: float,
    *,
    own: bool,
) -> BlockSpan:
    """One shaded span, titled with its first block's reason and how many more it took in."""
    began, ended = (start + timedelta(seconds=at) for at in (begin, finish))
    title = (
        f"blocked {clock_text(began)} → {clock_text(ended)} ({seconds_text(finish - begin)}): "
        f"{block_reason_text(joined[0], job=job)}"
    )
    if len(joined) > 1:
        title += f" (and {len(joined) - 1} more block{'s' if len(joined) > 2 else ''})"
    return BlockSpan(start=max(begin, 0.0), end=min(finish, length), title=title, own=own)
