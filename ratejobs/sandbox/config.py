"""What a sandbox enforces and advertises; each field is one `python -m ratejobs.sandbox` flag."""

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
        "latency",
        "error_rate",
        "seed",
        "max_log",
        "idempotency_header",
        "max_idempotency_keys",
    }
)
_FLOAT_FIELDS = frozenset({"rate", "period", "real_rate", "latency", "error_rate"})
_INT_FIELDS = frozenset({"burst", "seed", "max_log", "port", "max_idempotency_keys"})
_BOOL_FIELDS = frozenset({"no_limit", "retry_after"})
_OPTIONAL_FIELDS = frozenset({"real_rate", "seed"})


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

    def __post_init__(self) -> None:
        problems = []
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
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def enforced_rate(self) -> float:
        return self.rate if self.real_rate is None else self.real_rate

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
        ]
        if self.real_rate is not None:
            argv.append(f"--real-rate={self.real_rate!r}")
        if self.seed is not None:
            argv.append(f"--seed={self.seed}")
        if self.no_limit:
            argv.append("--no-limit")
        return argv


def build_parser() -> argparse.ArgumentParser:
    defaults = SandboxConfig()
    parser = argparse.ArgumentParser(
        prog="python -m ratejobs.sandbox",
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
        "--stop-on-stdin-close",
        action="store_true",
        help="exit when standard input closes (so a dead parent leaves no server behind)",
    )
    return parser


def config_from_args(args: argparse.Namespace) -> SandboxConfig:
    fields = {f.name for f in dataclasses.fields(SandboxConfig)}
    return SandboxConfig(**{k: v for k, v in vars(args).items() if k in fields})


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


def _coerce(name: str, value: Any) -> Any:
    if value is None and name in _OPTIONAL_FIELDS:
        return None
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
