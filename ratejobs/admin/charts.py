"""A job's chart as a small server-rendered SVG (no chart library, no CDN): calls/s per bucket,
the rate the limiter granted, its ceiling, the spans when the API was blocked, and the 429s."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import timedelta

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ratejobs.selectors.job_chart import OPERATOR, OTHER_JOB, OWN, JobChart
from ratejobs.text import clock_text, duration_text, rate_text, seconds_text

WIDTH, HEIGHT = 720, 230
LEFT, RIGHT, TOP, BOTTOM = 52, 14, 30, 38
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
# An axis reads best with a handful of round ticks.
MAX_Y_TICKS, MAX_X_TICKS = 5, 6
# Half the width of "14:03:27" at the ticks' font size.
CLOCK_LABEL_HALF_WIDTH = 24
# The paused spans' hatching, distinct from the blocks' flat shading; drawn by the SVG itself
# (presentation attributes), so the chart a poll swaps in needs nothing of the stylesheet.
PAUSED_COLOR = "#2a6fb0"
PAUSED_HATCH_ID = "rj-paused-hatch"
# A paused span at least this wide (pixels) carries the word "paused" as well.
PAUSED_LABEL_MIN_WIDTH = 40
# Steps between time ticks, in seconds: clock-like values only.
TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200)


def nice_ticks(top: float, most: int = MAX_Y_TICKS) -> list[float]:
    """0 and round values (1, 2, 2.5 or 5 times a power of ten) up to at least `top`, at most
    `most` in all."""
    top = max(top, 1e-9)
    for exponent in range(math.floor(math.log10(top / most)) - 1, 40):
        for mantissa in (1, 2, 2.5, 5):
            step = mantissa * 10.0**exponent
            count = math.ceil(top / step - 1e-9)
            if count + 1 <= most:
                return [round(step * i, 10) for i in range(max(count, 1) + 1)]
    return [0.0, top]


def _time_step(span: float) -> int:
    return next((step for step in TIME_STEPS if span / step <= MAX_X_TICKS), TIME_STEPS[-1])


def _tick_label(value: float) -> str:
    return f"{value:g}/s"  # round values by nice_ticks: "0.25/s", "20/s"


def job_chart_svg(chart: JobChart | None) -> SafeString:
    """Bars of calls/s per bucket under a y-axis in calls/s; the granted rate as a stepped
    line and the API's ceiling as a faint dashed one, so a job running at its limit shows bars
    touching the line; shaded spans while every call of the API waited out a block, hatched
    ones while the job sat paused; red marks
    under the bars where 429s came back; clock times along the x-axis; and a legend."""
    if chart is None:
        return format_html('<p class="rj-chart-empty">{}</p>', "Not started yet.")
    timeline = chart.timeline
    rates = timeline.calls_per_second
    highest = max(
        max(rates, default=0.0),
        chart.ceiling_per_second,
        max((rate for _, rate in chart.rate_steps), default=0.0),
    )
    y_ticks = nice_ticks(highest * 1.05)  # headroom: the highest bar or line stays off the top
    top = y_ticks[-1] or 1.0
    span = max(chart.span_seconds, 1.0)
    bar_w = PLOT_W / max(len(rates), 1)
    bottom = TOP + PLOT_H

    def x(seconds: float) -> float:
        return LEFT + seconds / span * PLOT_W

    def y(value: float) -> float:
        return bottom - value / top * PLOT_H

    def bucket_text(i: int) -> str:
        return clock_text(chart.start + timedelta(seconds=i * timeline.bucket_seconds))

    grid = format_html_join(
        "",
        '<line class="rj-grid" x1="{}" y1="{}" x2="{}" y2="{}"/>'
        '<text class="rj-tick" x="{}" y="{}" text-anchor="end" dy="3">{}</text>',
        (
            (
                LEFT,
                f"{y(v):.1f}",
                WIDTH - RIGHT,
                f"{y(v):.1f}",
                LEFT - 5,
                f"{y(v):.1f}",
                _tick_label(v),
            )
            for v in y_ticks
        ),
    )
    step = _time_step(span)
    x_ticks = format_html_join(
        "",
        '<line class="rj-axis" x1="{x}" y1="{b}" x2="{x}" y2="{b4}"/>'
        '<text class="rj-tick" x="{x}" y="{ly}" text-anchor="{anchor}">{label}</text>',
        (
            {
                "x": f"{x(s):.1f}",
                "b": bottom,
                "b4": bottom + 4,
                "ly": bottom + 22,
                "label": clock_text(chart.start + timedelta(seconds=s)),
                # a label centred on the last tick would run off the chart's right edge
                "anchor": "end" if x(s) > WIDTH - RIGHT - CLOCK_LABEL_HALF_WIDTH else "middle",
            }
            for s in range(0, int(span) + 1, step)
        ),
    )
    blocks = format_html_join(
        "",
        '<rect class="{}" x="{}" y="{}" width="{}" height="{}"><title>{}</title></rect>',
        (
            (
                "rj-block" if block.own else "rj-block rj-block-other",
                f"{x(block.start):.1f}",
                TOP,
                f"{max(x(block.end) - x(block.start), 1.0):.1f}",
                PLOT_H,
                block.title,
            )
            for block in chart.blocks
        ),
    )
    pauses = _paused_bands(chart, x)
    bars = format_html_join(
        "",
        '<rect class="rj-bar" x="{}" y="{}" width="{}" height="{}"><title>{}: {}</title></rect>',
        (
            (
                f"{LEFT + i * bar_w:.1f}",
                f"{y(rate):.1f}",
                f"{max(bar_w - 1, 0.5):.1f}",
                f"{bottom - y(rate):.1f}",
                bucket_text(i),
                f"{rate_text(rate)} finished"
                + (
                    f" (average over {timeline.bucket_seconds} s)"
                    if timeline.bucket_seconds > 1
                    else ""
                ),
            )
            for i, rate in enumerate(rates)
            if rate > 0
        ),
    )
    throttles = format_html_join(
        "",
        '<rect class="rj-429" x="{}" y="{}" width="{}" height="6">'
        "<title>{}: {} × 429</title></rect>",
        (
            (f"{LEFT + i * bar_w:.1f}", bottom + 2, f"{max(bar_w - 1, 0.5):.1f}", bucket_text(i), n)
            for i, n in enumerate(timeline.throttled)
            if n
        ),
    )
    ceiling_y = f"{y(chart.ceiling_per_second):.1f}"
    ceiling = format_html(
        '<line class="rj-ceiling" x1="{l}" y1="{y}" x2="{r}" y2="{y}">'
        "<title>configured ceiling: {rate}</title></line>"
        '<text class="rj-ceiling-label" x="{r}" y="{y}" dy="-3" text-anchor="end">'
        "ceiling {rate}</text>",
        l=LEFT,
        r=WIDTH - RIGHT,
        y=ceiling_y,
        rate=rate_text(chart.ceiling_per_second),
    )
    rate_line = ""
    if chart.adaptive and chart.rate_steps:
        last_at, last_rate = chart.rate_steps[-1]
        points = []
        previous = None
        for seconds, rate in chart.rate_steps:
            if previous is not None:
                points.append(f"{x(seconds):.1f},{y(previous):.1f}")
            points.append(f"{x(seconds):.1f},{y(rate):.1f}")
            previous = rate
        rate_line = format_html(
            '<polyline class="rj-rate" points="{}"><title>{}: {} at {}</title></polyline>',
            " ".join(points),
            chart.rate_source,
            rate_text(last_rate),
            clock_text(chart.start + timedelta(seconds=last_at)),
        )
    legend = _legend(chart)
    svg = format_html(
        '<svg class="rj-chart" viewBox="0 0 {w} {h}" width="100%" role="img" '
        'aria-label="calls per second, the granted rate, blocks and 429s over time" '
        'xmlns="http://www.w3.org/2000/svg">'
        "{blocks}{pauses}{grid}"
        '<line class="rj-axis" x1="{l}" y1="{b}" x2="{r}" y2="{b}"/>'
        '<line class="rj-axis" x1="{l}" y1="{t}" x2="{l}" y2="{b}"/>'
        "{bars}{ceiling}{rate_line}{throttles}{x_ticks}"
        '<text class="rj-tick" x="{r}" y="{note_y}" text-anchor="end">{note}</text>'
        "{legend}</svg>",
        w=WIDTH,
        h=HEIGHT,
        l=LEFT,
        r=WIDTH - RIGHT,
        t=TOP,
        b=bottom,
        blocks=blocks,
        pauses=pauses,
        grid=grid,
        bars=bars,
        ceiling=ceiling,
        rate_line=rate_line,
        throttles=throttles,
        x_ticks=x_ticks,
        note_y=HEIGHT - 2,
        note=f"{duration_text(span)} in {timeline.bucket_seconds} s buckets",
        legend=legend,
    )
    return format_html('{}<p class="rj-chart-note">{}</p>', svg, blocks_note(chart))


def _paused_bands(chart: JobChart, x: Callable[[float], float]) -> SafeString:
    """The spans the job sat paused, hatched over the plot's height and named in their title
    (and in the band, when it is wide enough to read)."""
    if not chart.pauses:
        return SafeString("")
    bands = []
    for pause in chart.pauses:
        left, width = x(pause.start), max(x(pause.end) - x(pause.start), 1.0)
        label = ""
        if width >= PAUSED_LABEL_MIN_WIDTH:
            label = format_html(
                '<text class="rj-tick rj-paused-label" x="{}" y="{}" text-anchor="middle">'
                "paused</text>",
                f"{left + width / 2:.1f}",
                TOP + 12,
            )
        bands.append(
            format_html(
                '<rect class="rj-paused" x="{}" y="{}" width="{}" height="{}" fill="url(#{})" '
                'stroke="{}" stroke-opacity="0.5"><title>{}</title></rect>{}',
                f"{left:.1f}",
                TOP,
                f"{width:.1f}",
                PLOT_H,
                PAUSED_HATCH_ID,
                PAUSED_COLOR,
                pause.title,
                label,
            )
        )
    return format_html(
        '<defs><pattern id="{}" patternUnits="userSpaceOnUse" width="6" height="6" '
        'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="{}" '
        'stroke-width="2" stroke-opacity="0.45"/></pattern></defs>'
        '<g class="rj-pauses">{}</g>',
        PAUSED_HATCH_ID,
        PAUSED_COLOR,
        format_html_join("", "{}", ((band,) for band in bands)),
    )


def blocks_note(chart: JobChart) -> str:
    """Whose 429s made the job wait, in words under the chart: a job without a 429 of its own
    may still sit beside shaded spans that another job's 429 or an operator's block caused,
    and the page must not say the limiter kept it clear of throttling then."""
    blocked = chart.blocked_seconds
    own = chart.own_throttles
    if own:
        text = f"{own:,} × 429 for this job"
        if blocked.get(OWN):
            text += f" (they blocked the API {seconds_text(blocked[OWN])})"
    else:
        text = "No 429 for this job"
        if blocked.get(OWN):  # a spent quota the rate limit headers told of
            text += f"; its spent quota blocked the API {seconds_text(blocked[OWN])}"
    others = []
    if blocked.get(OTHER_JOB):
        others.append(f"{seconds_text(blocked[OTHER_JOB])} by another job's 429s")
    if blocked.get(OPERATOR):
        others.append(f"{seconds_text(blocked[OPERATOR])} by an operator's block")
    if others:
        text += "; the API was blocked " + " and ".join(others) + " (grey)"
    elif not own and not blocked.get(OWN):
        text += "; the API was not blocked while it ran"
    return text + "."


# Legend entries: (CSS class of the swatch, how it is drawn, text).
_SWATCH = {
    "bar": '<rect class="rj-bar" x="{x}" y="6" width="10" height="10"/>',
    "line": '<line class="{cls}" x1="{x}" y1="11" x2="{x2}" y2="11"/>',
    "block": '<rect class="{cls}" x="{x}" y="6" width="10" height="10"/>',
    "429": '<rect class="rj-429" x="{x}" y="8" width="10" height="6"/>',
    "paused": '<rect class="{cls}" x="{x}" y="6" width="10" height="10" fill="url(#{hatch})" '
    'stroke="{color}" stroke-opacity="0.5"/>',
}


def _legend(chart: JobChart) -> SafeString:
    entries = [("bar", "", "calls/s finished")]
    if chart.adaptive and chart.rate_steps:
        entries.append(("line", "rj-rate", chart.rate_source))
    entries.append(("line", "rj-ceiling", "ceiling"))
    if any(block.own for block in chart.blocks) or not chart.blocks:
        entries.append(("block", "rj-block", "blocked by this job"))
    if any(not block.own for block in chart.blocks):
        entries.append(("block", "rj-block rj-block-other", "blocked by others"))
    if chart.pauses:
        entries.append(("paused", "rj-paused", "paused"))
    entries.append(("429", "", "429s"))
    parts = []
    at = LEFT
    for kind, cls, text in entries:
        swatch = format_html(
            _SWATCH[kind], x=at, x2=at + 14, cls=cls, hatch=PAUSED_HATCH_ID, color=PAUSED_COLOR
        )
        parts.append((swatch, at + 18, text))
        at += 24 + 6 * len(text)
    return format_html(
        '<g class="rj-legend">{}</g>',
        format_html_join(
            "",
            '<g class="rj-legend-item">{}<text class="rj-tick" x="{}" y="15">{}</text></g>',
            parts,
        ),
    )
