"""The shared limiter on a requests Session: `session.mount(base_url, LimitedAdapter(limiter))`."""

from __future__ import annotations

from typing import Any

from requests import PreparedRequest, Response
from requests.adapters import HTTPAdapter

from ratejobs.limiter.adapters.accounting import ACCOUNTING_OPTIONS, Finish, Limited
from ratejobs.limiter.sync import Limiter


class LimitedAdapter(Limited, HTTPAdapter):
    """An HTTPAdapter whose every request takes a slot of `limiter` first (WaitTooLong after
    max_wait seconds), feeds its response back to it, settles its real cost (`cost_header`, or
    `cost_json_field` in a body that is not streamed) and gives its in-flight lease back once
    the response is done: read, or closed. With `retries`, a throttled request (429, or a 403
    whose headers hint at a limit) is sent again after the block it caused, waiting for its
    slot as everyone else does. `cost` is the estimate of each request, or a function of the
    PreparedRequest. The keyword arguments are max_wait, retries, cost, cost_header,
    cost_json_field and lease_seconds (Limited); the others go to HTTPAdapter (pool sizes)."""

    def __init__(self, limiter: Limiter, **options: Any) -> None:
        Limited.__init__(
            self, limiter, **{k: options.pop(k) for k in ACCOUNTING_OPTIONS if k in options}
        )
        HTTPAdapter.__init__(self, **options)

    def send(self, request: PreparedRequest, stream: bool = False, **options: Any) -> Response:
        def hand_over(response: Response, finish: Finish) -> None:
            if stream:
                _on_done(response, finish)
            else:
                finish(response.content)  # requests reads it next anyway

        return self.send_limited(
            request,
            lambda fresh: HTTPAdapter.send(self, request, stream=stream, **options),
            lambda response: (response.status_code, response.headers),
            Response.close,
            hand_over,
        )


def _on_done(response: Response, finish: Finish) -> None:
    """Call `finish` when the streamed body has been read to its end (urllib3 then releases the
    connection) or the response is closed, whichever comes first."""
    raw = response.raw
    release_conn, close = raw.release_conn, raw.close

    def released() -> None:
        try:
            release_conn()
        finally:
            finish()

    def closed() -> None:
        try:
            close()
        finally:
            finish()

    raw.release_conn = released
    raw.close = closed
