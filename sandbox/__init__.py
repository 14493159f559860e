"""A real rate-limited HTTP API standing in for the third party in tests, the demo and benchmarks.

No Django and no Celery here. Serve it in-process with `Sandbox`, as a child process with
`start_sandbox_process`, or from a shell with `python -m sandbox --port 8081 --rate 20
--burst 5` (`--help` lists the flags; each is a `SandboxConfig` field).

Every request to an API route is an *arrival*. The server decides it on arrival with a GCRA
bucket of `real_rate` (default `rate`) per `period` with `burst`, on time.monotonic_ns; over the
limit it answers 429 `{"error": "rate limited"}` with Retry-After (unless disabled). The quota
headers (`github`: X-RateLimit-Limit/-Remaining/-Reset as an epoch; `ietf`: RateLimit-Policy
and RateLimit; `openai`: x-ratelimit-*-requests with a duration reset; `anthropic`:
anthropic-ratelimit-requests-* with an RFC 3339 reset; `shopify`: X-Shopify-Shop-Api-Call-Limit,
used/burst) advertise `rate` on every response, including 429s. Every response carries a Date
header unless `--no-date` (/__config `"date": false`), as some servers and proxies send none.

Idempotency, as Stripe's: a request carrying a key in `idempotency_header` (default
Idempotency-Key; "" turns it off) whose key was answered before gets that first answer again
(status, body and headers, plus `Idempotent-Replayed: true`) and is no arrival: neither counted,
logged nor charged to the limit. Answers of 429 and 5xx are not remembered, so a retry after
them is a new arrival. While a key's first request is being answered, another with that key gets
409 (no arrival either). The last `max_idempotency_keys` answers are kept.

Windows and tokens. `--window RATE/PERIOD[/BURST]` (repeatable; /__config `"windows": [[rate,
period, burst], ...]`, burst optional, default RATE rounded down: the whole quota at once) adds
GCRA buckets enforced besides the main one, e.g. `--rate 20 --window 300/60` for 20/s AND
300/min. `--token-budget RATE/PERIOD[/BURST]` (/__config `token_rate`, `token_period`,
`token_burst`; `token_rate: null` turns it off; burst default RATE rounded down) adds a budget
of tokens: a request asks for `?tokens=N` or a JSON object body's `"tokens": N` (the query
wins; default 1; not a whole number >= 0, or more than the burst, is a 400 costing no tokens).
A request is admitted only when every bucket can take it, then taken from all; a refused one
is charged to none, and its 429's Retry-After is the time until it fits every bucket (whole
seconds rounded up; none for a request that never fits). With a budget, or when the request
names its tokens, every answer carries `X-Tokens-Used: <tokens charged>` (0 on a 429) and an
admitted JSON body `"usage": {"total_tokens": N}`. Quota headers advertise the tightest of
the main quota and the windows (fewest left, then the longest reset); `ietf` lists all of them
(the main one as "default", then "window:<i>", then "tokens";qu="tokens"); `openai` and
`anthropic` add their tokens fields from the budget. no_limit leaves windows and budget alone.

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
answered), unique_keys (keys whose answer was remembered: the distinct keys acted on),
throttled_by ({"main", "window:<i>" for each window, "tokens"}: 429s by the bucket that asked the
longest wait), windows ([{"rate", "period", "burst", "worst_window_admitted" (most admitted in
any span of its period), "allowed" (burst + rate; null with no_limit)}]), tokens ({"budget"
(on or not), "admitted" (tokens charged), "throttled", "window" (token_period; period without
a budget), "worst_window" (most tokens admitted in any span of it), "allowed" (token_burst +
token_rate; null without a budget or with no_limit)}), config; with detail=1 also log: [{"n",
"t" (epoch), "status", "path", "request_id" (X-Request-Id), "idempotency_key", "tokens"
(charged), and for 429s "retry_after", "sent", "retry_until", "cause"}].

Per credential (`--limit-by-header Authorization`): each distinct value of that header gets
buckets of its own with the same limits (made full on first sight; the least recently seen of
more than 100,000 are forgotten), as an API that limits each customer's key apart; a request
without the header shares the empty value's. /__stats then adds buckets: {<digest of the
value>: {"arrivals", "throttled", "worst_window_admitted"}}, log entries carry "bucket" (the
digest: a credential is never shown), and retry_after_violations counts each value apart.
"""

from __future__ import annotations

from sandbox.config import SandboxConfig
from sandbox.process import SandboxProcess, start_sandbox_process
from sandbox.server import Sandbox

__all__ = ["Sandbox", "SandboxConfig", "SandboxProcess", "start_sandbox_process"]
