"""What a sandbox enforces and advertises; each field is one `python -m sandbox` flag."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

HeaderStyle = Literal["github", "ietf", "openai", "anthropic", "shopify", "none"]
RetryAfterFormat = Literal["delta", "date"]
HEADER_STYLES: tuple[HeaderStyle, ...] = (
    "github",
    "ietf",
    "openai",
    "anthropic",
    "shopify",
    "none",
)
RETRY_AFTER_FORMATS: tuple[RetryAfterFormat, ...] = ("delta", "date")

# An arrival costs about 150 bytes of log; a million is hours of demo traffic or a long benchmark.
# Past it the oldest arrivals leave the log (the window statistics), the counters stay exact.
DEFAULT_MAX_LOG = 1_000_000
DEFAULT_CLI_PORT = 8081
# Stripe's name for it; "" turns idempotency off.
DEFAULT_IDEMPOTENCY_HEADER = "Idempotency-Key"
# A remembered answer costs a few hundred bytes (key, status, small JSON body): a million is a
# few hundred MB at most, and more distinct keys than any test or benchmark sends. Past it the
# oldest keys are forgotten, and a retry with one of those counts as a new arrival.
DEFAULT_MAX_IDEMPOTENCY_KEYS = 1_000_000
# RFC 9110's token: what a header name may be.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")

# What /__config may change on a running sandbox: everything but where it listens.
LIVE_FIELDS = frozenset(
    {
        "rate",
        "burst",
        "period",
        "real_rate",
        "no_limit",
        "retry_after",
        "retry_after_format",
        "headers",
        "date",
        "latency",
        "error_rate",
        "seed",
        "max_log",
        "idempotency_header",
        "max_idempotency_keys",
        "windows",
        "token_rate",
        "token_period",
        "token_burst",
    }
)
_FLOAT_FIELDS = frozenset(
    {"rate", "period", "real_rate", "latency", "error_rate", "token_rate", "token_period"}
)
_INT_FIELDS = frozenset({"burst", "seed", "max_log", "port", "max_idempotency_keys", "token_burst"})
_BOOL_FIELDS = frozenset({"no_limit", "retry_after", "date"})
_OPTIONAL_FIELDS = frozenset({"real_rate", "seed", "token_rate", "token_period", "token_burst"})
# A quota on the command line: "300/60" (300 per 60 s) or "300/60/50" (with a burst of 50).
_QUOTA_SPEC = re.compile(r"^\s*([^/\s]+)\s*/\s*([^/\s]+)\s*(?:/\s*([^/\s]+)\s*)?$")

Window = tuple[float, float, int]  # rate, period (seconds), burst


@dataclass(frozen=True)
class SandboxConfig:
    """A rate-limited API: `rate` per `period` with `burst` is what its headers advertise,
    `real_rate` (default: `rate`) what it enforces."""

    rate: float = 20.0
    burst: int = 5
    period: float = 1.0
    real_rate: float | None = None
    no_limit: bool = False  # never answer 429
    retry_after: bool = True  # send Retry-After on 429
    retry_after_format: RetryAfterFormat = "delta"  # whole seconds rounded up, or an HTTP-date
    headers: HeaderStyle = "github"  # quota headers on every response
    # A Date header on every response, as RFC 9110 asks of a server with a clock; without one a
    # client reads an epoch or HTTP-date reset on a clock of its own choosing.
    date: bool = True
    latency: float = 0.0  # seconds added to every API response
    error_rate: float = 0.0  # fraction of admitted requests answered 500
    seed: int | None = None  # seed of the error-rate RNG; None: unseeded
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port
    max_log: int = DEFAULT_MAX_LOG
    # A request carrying this header is answered once per key: a repeat gets the first answer
    # again and is no arrival (as Stripe's Idempotency-Key); "" ignores the header.
    idempotency_header: str = DEFAULT_IDEMPOTENCY_HEADER
    max_idempotency_keys: int = DEFAULT_MAX_IDEMPOTENCY_KEYS  # remembered answers, oldest go
    # Each distinct value of this request header (Authorization: one per customer credential)
    # gets buckets of its own with these limits, as an API limiting per credential does;
    # "": one set of buckets for every request.
    limit_by_header: str = ""
    # Buckets enforced besides the main one, each (rate, period, burst): "20/s AND 300/min" is
    # rate=20, period=1 and windows=((300, 60, 300),). Advertised as they are enforced.
    windows: tuple[Window, ...] = ()
    # A budget of tokens besides the request count (OpenAI's TPM): a request asks for its
    # tokens (?tokens=N or a JSON body's "tokens", default 1) and is refused unless all of them
    # fit. None: no budget. The burst defaults to the rate (a whole quota at once).
    token_rate: float | None = None
    token_period: float | None = None
    token_burst: int | None = None

    def __post_init__(self) -> None:
        problems = []
        try:
            # Lists from JSON or argparse become the tuples the dataclass promises.
            object.__setattr__(self, "windows", tuple(_window(w) for w in self.windows))
        except (TypeError, ValueError) as exc:
            problems.append(str(exc))
        if self.token_rate is not None:
            if not _positive(self.token_rate):
                problems.append("token_rate must be a positive number")
            if self.token_period is None:
                problems.append("token_period is needed with token_rate")
        if self.token_period is not None and not _positive(self.token_period):
            problems.append("token_period must be a positive number")
        if self.token_burst is not None and self.token_burst < 1:
            problems.append("token_burst must be at least 1")
        for name in ("rate", "period"):
            if not _positive(getattr(self, name)):
                problems.append(f"{name} must be a positive number")
        if self.real_rate is not None and not _positive(self.real_rate):
            problems.append("real_rate must be a positive number")
        if self.burst < 1:
            problems.append("burst must be at least 1")
        if not (math.isfinite(self.latency) and self.latency >= 0):
            problems.append("latency must be >= 0")
        if not 0 <= self.error_rate <= 1:
            problems.append("error_rate must be between 0 and 1")
        if self.headers not in HEADER_STYLES:
            problems.append(f"headers must be one of {', '.join(HEADER_STYLES)}")
        if self.retry_after_format not in RETRY_AFTER_FORMATS:
            problems.append(f"retry_after_format must be one of {', '.join(RETRY_AFTER_FORMATS)}")
        if not 0 <= self.port <= 65535:
            problems.append("port must be between 0 and 65535")
        if self.max_log < 0:
            problems.append("max_log must be >= 0")
        if self.idempotency_header and not _HEADER_NAME.match(self.idempotency_header):
            problems.append("idempotency_header must be a header name (an HTTP token) or empty")
        if self.max_idempotency_keys < 0:
            problems.append("max_idempotency_keys must be >= 0")
        if self.limit_by_header and not _HEADER_NAME.match(self.limit_by_header):
            problems.append("limit_by_header must be a header name (an HTTP token) or empty")
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def enforced_rate(self) -> float:
        return self.rate if self.real_rate is None else self.real_rate

    @property
    def effective_token_burst(self) -> int:
        """The token budget's burst: as set, else its whole rate (at least 1); 0 with no budget."""
        if self.token_rate is None:
            return 0
        return default_burst(self.token_rate) if self.token_burst is None else self.token_burst

    def with_changes(self, changes: Mapping[str, Any]) -> SandboxConfig:
        """A copy with `changes` (JSON values, as /__config receives them) applied; ValueError on
        an unknown field, a value of the wrong type or a combination that makes no sense."""
        unknown = sorted(set(changes) - LIVE_FIELDS)
        if unknown:
            raise ValueError(f"cannot change {', '.join(unknown)}")
        return dataclasses.replace(self, **{k: _coerce(k, v) for k, v in changes.items()})

    def live_fields(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in sorted(LIVE_FIELDS)}

    def to_argv(self) -> list[str]:
        """The command-line flags that recreate this config."""
        argv = [
            f"--host={self.host}",
            f"--port={self.port}",
            f"--rate={self.rate!r}",
            f"--burst={self.burst}",
            f"--period={self.period!r}",
            f"--retry-after-format={self.retry_after_format}",
            f"--headers={self.headers}",
            f"--latency={self.latency!r}",
            f"--error-rate={self.error_rate!r}",
            f"--max-log={self.max_log}",
            f"--idempotency-header={self.idempotency_header}",
            f"--max-idempotency-keys={self.max_idempotency_keys}",
            "--retry-after" if self.retry_after else "--no-retry-after",
            "--date" if self.date else "--no-date",
        ]
        if self.real_rate is not None:
            argv.append(f"--real-rate={self.real_rate!r}")
        if self.seed is not None:
            argv.append(f"--seed={self.seed}")
        if self.no_limit:
            argv.append("--no-limit")
        if self.limit_by_header:
            argv.append(f"--limit-by-header={self.limit_by_header}")
        argv.extend(f"--window={format_quota(*window)}" for window in self.windows)
        if self.token_rate is not None and self.token_period is not None:
            spec = format_quota(self.token_rate, self.token_period, self.token_burst)
            argv.append(f"--token-budget={spec}")
        return argv


def build_parser() -> argparse.ArgumentParser:
    defaults = SandboxConfig()
    parser = argparse.ArgumentParser(
        prog="python -m sandbox",
        description="A real rate-limited HTTP API for tests, the demo and benchmarks.",
    )
    parser.add_argument("--host", default=defaults.host)
    parser.add_argument(
        "--port", type=int, default=DEFAULT_CLI_PORT, help="0 picks a free port (printed)"
    )
    parser.add_argument("--rate", type=float, default=defaults.rate, help="advertised requests")
    parser.add_argument("--burst", type=int, default=defaults.burst)
    parser.add_argument("--period", type=float, default=defaults.period, help="seconds")
    parser.add_argument(
        "--real-rate", type=float, default=None, help="requests per period enforced (default: rate)"
    )
    parser.add_argument("--no-limit", action="store_true", help="never answer 429")
    parser.add_argument(
        "--retry-after",
        action=argparse.BooleanOptionalAction,
        default=defaults.retry_after,
        help="send Retry-After on 429",
    )
    parser.add_argument(
        "--retry-after-format", choices=RETRY_AFTER_FORMATS, default=defaults.retry_after_format
    )
    parser.add_argument("--headers", choices=HEADER_STYLES, default=defaults.headers)
    parser.add_argument(
        "--date",
        action=argparse.BooleanOptionalAction,
        default=defaults.date,
        help="send a Date header on every response",
    )
    parser.add_argument("--latency", type=float, default=defaults.latency, help="seconds")
    parser.add_argument("--error-rate", type=float, default=defaults.error_rate)
    parser.add_argument("--seed", type=int, default=None, help="seed of the error-rate RNG")
    parser.add_argument(
        "--max-log", type=int, default=defaults.max_log, help="arrivals kept for /__stats"
    )
    parser.add_argument(
        "--idempotency-header",
        default=defaults.idempotency_header,
        help='a repeated key in this header gets the first answer again; "" ignores it',
    )
    parser.add_argument(
        "--max-idempotency-keys",
        type=int,
        default=defaults.max_idempotency_keys,
        help="answers remembered by key; the oldest are forgotten past it",
    )
    parser.add_argument(
        "--window",
        dest="windows",
        metavar="RATE/PERIOD[/BURST]",
        type=parse_window,
        action="append",
        default=[],
        help="a bucket enforced besides the main one, e.g. 300/60 (repeatable); BURST defaults "
        "to RATE, a whole quota at once",
    )
    parser.add_argument(
        "--token-budget",
        metavar="RATE/PERIOD[/BURST]",
        type=parse_token_budget,
        default=None,
        help="tokens per PERIOD seconds; a request costs ?tokens=N or its JSON body's "
        '"tokens" (default 1); BURST defaults to RATE',
    )
    parser.add_argument(
        "--limit-by-header",
        default=defaults.limit_by_header,
        metavar="HEADER",
        help="give each distinct value of this header (e.g. Authorization) its own buckets",
    )
    parser.add_argument(
        "--stop-on-stdin-close",
        action="store_true",
        help="exit when standard input closes (so a dead parent leaves no server behind)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> SandboxConfig:
    fields = {f.name for f in dataclasses.fields(SandboxConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields}
    budget = getattr(args, "token_budget", None)
    if budget is not None:
        values["token_rate"], values["token_period"], values["token_burst"] = budget
    return SandboxConfig(**values)


def parse_argv(argv: Sequence[str] | None = None) -> tuple[SandboxConfig, argparse.Namespace]:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return config_from_args(args), args
    except ValueError as exc:
        parser.error(str(exc))
        raise  # parser.error exits; this line only satisfies the type checker


def _positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def default_burst(rate: float) -> int:
    """A plain "RATE per PERIOD" quota: the whole of it at once, as a fresh fixed window or
    Anthropic's continuously refilled bucket allows; rounded down, never looser.

    A client keeping to the same GCRA (rate, period, burst) never gets a 429 from it, while one
    keeping only to the main limit, at a pace P > rate/period, is refused once the burst is
    spent: after burst / (P - rate/period) seconds. A "no 429s" test must run past that (or set
    a small burst) to prove anything."""
    return max(1, math.floor(rate))


def parse_quota_spec(text: str) -> tuple[float, float, int | None]:
    """ "RATE/PERIOD[/BURST]" as (rate, period, burst or None); ValueError if malformed."""
    match = _QUOTA_SPEC.match(text)
    if match is None:
        raise ValueError(f"expected RATE/PERIOD[/BURST], got {text!r}")
    try:
        rate, period, burst = float(match[1]), float(match[2]), match[3]
    except ValueError:
        raise ValueError(f"rate and period must be numbers in {text!r}") from None
    if not (_positive(rate) and _positive(period)):
        raise ValueError(f"rate and period must be positive numbers in {text!r}")
    if burst is None:
        return rate, period, None
    if not burst.isdigit() or int(burst) < 1:
        raise ValueError(f"burst must be a whole number of at least 1 in {text!r}")
    return rate, period, int(burst)


def parse_window(text: str) -> Window:
    """--window's value: a burst left out is the whole rate."""
    try:
        rate, period, burst = parse_quota_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return rate, period, default_burst(rate) if burst is None else burst


def parse_token_budget(text: str) -> tuple[float, float, int | None]:
    try:
        return parse_quota_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def format_quota(rate: float, period: float, burst: int | None = None) -> str:
    text = f"{rate!r}/{period!r}"
    return text if burst is None else f"{text}/{burst}"


def _window(value: Any) -> Window:
    """A window from Python or JSON: [rate, period] or [rate, period, burst]."""
    if isinstance(value, str) or not isinstance(value, Sequence) or len(value) not in (2, 3):
        raise ValueError(f"a window is [rate, period] or [rate, period, burst], not {value!r}")
    rate, period = value[0], value[1]
    if not (_is_number(rate) and _is_number(period) and _positive(rate) and _positive(period)):
        raise ValueError(f"a window's rate and period must be positive numbers: {value!r}")
    burst = default_burst(rate) if len(value) == 2 else value[2]
    if isinstance(burst, bool) or not isinstance(burst, int) or burst < 1:
        raise ValueError(f"a window's burst must be a whole number of at least 1: {value!r}")
    return float(rate), float(period), burst


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _coerce(name: str, value: Any) -> Any:
    if value is None and name in _OPTIONAL_FIELDS:
        return None
    if name == "windows":
        if isinstance(value, list | tuple):  # a JSON list, or tuples from Sandbox.configure()
            return tuple(_window(window) for window in value)
        raise ValueError(f"windows must be a list of [rate, period(, burst)], not {value!r}")
    # bool is an int to Python, but `true` is not a rate.
    if name in _BOOL_FIELDS:
        if isinstance(value, bool):
            return value
    elif name in _INT_FIELDS:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif name in _FLOAT_FIELDS:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif isinstance(value, str):
        return value
    raise ValueError(f"bad value for {name}: {value!r}")
