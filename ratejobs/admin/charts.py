"""A job's calls/s and 429s as a small server-rendered SVG: no chart library, no CDN."""

from __future__ import annotations

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ratejobs.selectors.jobs import Timeline

WIDTH, HEIGHT = 720, 180
LEFT, RIGHT, TOP, BOTTOM = 48, 12, 14, 26


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def timeline_svg(timeline: Timeline | None) -> SafeString:
    """Bars of calls/s per bucket, red marks where 429s came back, and the API's limit as a
    dashed line, so a job running at its limit shows bars touching the line."""
    if timeline is None:
        return format_html('<p class="rj-chart-empty">{}</p>', "Not started yet.")
    buckets = len(timeline.calls_per_second)
    top = max(max(timeline.calls_per_second, default=0.0), timeline.limit_per_second) * 1.1 or 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    bar_w = plot_w / buckets

    def y(value: float) -> float:
        return TOP + plot_h - value / top * plot_h

    bars = format_html_join(
        "",
        '<rect class="rj-bar" x="{}" y="{}" width="{}" height="{}">'
        "<title>{}: {} calls/s</title></rect>",
        (
            (
                f"{LEFT + i * bar_w:.1f}",
                f"{y(rate):.1f}",
                f"{max(bar_w - 1, 0.5):.1f}",
                f"{TOP + plot_h - y(rate):.1f}",
                f"+{_duration(i * timeline.bucket_seconds)}",
                f"{rate:.1f}",
            )
            for i, rate in enumerate(timeline.calls_per_second)
        ),
    )
    throttles = format_html_join(
        "",
        '<rect class="rj-429" x="{}" y="{}" width="{}" height="6">'
        "<title>+{}: {} × 429</title></rect>",
        (
            (
                f"{LEFT + i * bar_w:.1f}",
                TOP + plot_h + 2,
                f"{max(bar_w - 1, 0.5):.1f}",
                _duration(i * timeline.bucket_seconds),
                count,
            )
            for i, count in enumerate(timeline.throttled)
            if count
        ),
    )
    limit_y = y(timeline.limit_per_second)
    span = buckets * timeline.bucket_seconds
    return format_html(
        '<svg class="rj-chart" viewBox="0 0 {w} {h}" width="100%" role="img" '
        'aria-label="calls per second and 429s over time" xmlns="http://www.w3.org/2000/svg">'
        '<line class="rj-axis" x1="{l}" y1="{b}" x2="{r}" y2="{b}"/>'
        '<line class="rj-axis" x1="{l}" y1="{t}" x2="{l}" y2="{b}"/>'
        "{bars}{throttles}"
        '<line class="rj-limit" x1="{l}" y1="{ly}" x2="{r}" y2="{ly}">'
        "<title>API limit: {limit} calls/s</title></line>"
        '<text x="{tl}" y="{ly}" text-anchor="end" dy="4">{limit}/s</text>'
        '<text x="{tl}" y="{b}" text-anchor="end">0</text>'
        '<text x="{l}" y="{label_y}">start</text>'
        '<text x="{r}" y="{label_y}" text-anchor="end">+{span} ({bucket} s buckets)</text>'
        "</svg>",
        w=WIDTH,
        h=HEIGHT,
        l=LEFT,
        r=WIDTH - RIGHT,
        t=TOP,
        b=TOP + plot_h,
        tl=LEFT - 4,
        bars=bars,
        throttles=throttles,
        ly=f"{limit_y:.1f}",
        limit=f"{timeline.limit_per_second:.3g}",
        label_y=HEIGHT - 4,
        span=_duration(span),
        bucket=timeline.bucket_seconds,
    )
