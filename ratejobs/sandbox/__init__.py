"""A real rate-limited HTTP API standing in for the third party in tests, the demo and benchmarks.

No Django and no Celery here. Serve it in-process with `Sandbox`, as a child process with
`start_sandbox_process`, or from a shell with `python -m ratejobs.sandbox --port 8081 --rate 20
--burst 5` (`--help` lists the flags; each is a `SandboxConfig` field).

Every request to an API route is an *arrival*. The server decides it on arrival with a GCRA
bucket of `real_rate` (default `rate`) per `period` with `burst`, on time.monotonic_ns; over the
limit it answers 429 `{"error": "rate limited"}` with Retry-After (unless disabled). The quota
headers (`github`: X-RateLimit-Limit/-Remaining/-Reset as an epoch; `ietf`: RateLimit-Policy
and RateLimit; `openai`: x-ratelimit-*-requests with a duration reset; `anthropic`:
anthropic-ratelimit-requests-* with an RFC 3339 reset; `shopify`: X-Shopify-Shop-Api-Call-Limit,
used/burst) advertise `rate` on every response, including 429s.

Idempotency, as Stripe's: a request carrying a key in `idempotency_header` (default
Idempotency-Key; "" turns it off) whose key was answered before gets that first answer again
(status, body and headers, plus `Idempotent-Replayed: true`) and is no arrival: neither counted,
logged nor charged to the limit. Answers of 429 and 5xx are not remembered, so a retry after
them is a new arrival. While a key's first request is being answered, another with that key gets
409 (no arrival either). The last `max_idempotency_keys` answers are kept.

API routes (any method, rate-limited first, then `error_rate` of them answered 500):
  /<anything>            200 {"method", "path", "query", "n", "body_bytes"}
  /status/<code>         that status (200-599), {"status", "n"}
  /redirect?to=<url>     302 to <url>
  /slow?seconds=<s>      answers after s seconds
  /big?bytes=<n>         n bytes of application/octet-stream

Control routes (never limited, not arrivals, no added latency):
  /__stats[?window=<s>][&detail=1]   counters and invariants, see below
  /__reset (POST)                    clears counters, the log, the bucket and the keys; reseeds
                                     the RNG
  /__config (GET, POST JSON)         the live config; POST changes any of LIVE_FIELDS

/__stats keys: arrivals, ok (status < 400), throttled (429s from the limit), errors (other
>= 400), by_status, window (default `period`), worst_window (most arrivals in any window of that
length), worst_window_admitted (the same, without the throttled ones), allowed (burst + window *
real_rate / period; null with no_limit), retry_after_violations (arrivals after a 429 was sent and
before its Retry-After ran out, from any client: the quota is shared), log_size, log_dropped,
idempotent_replays (answers given again for a key), idempotent_conflicts (409s for a key being
answered), unique_keys (keys whose answer was remembered: the distinct keys acted on), config;
with detail=1 also log: [{"n", "t" (epoch), "status", "path", "request_id" (X-Request-Id),
"idempotency_key", and for 429s "retry_after", "sent", "retry_until"}].
"""

from __future__ import annotations

from ratejobs.sandbox.config import SandboxConfig
from ratejobs.sandbox.process import SandboxProcess, start_sandbox_process
from ratejobs.sandbox.server import Sandbox

__all__ = ["Sandbox", "SandboxConfig", "SandboxProcess", "start_sandbox_process"]
