"""The shared limiter of each API (and of each of its credential keys), one object per process
kept in a bounded cache, on the process's Redis client."""

from __future__ import annotations

import threading
from collections import OrderedDict

from ratejobs.infra.connections import redis_client
from ratejobs.limiter import Limiter
from ratejobs.limiter.core import RATE_SAMPLES_KEPT
from ratejobs.models import Api
from ratejobs.namespace import limiter_key_prefix

# Limiter objects kept per process, most recently used last: one per API and one per credential
# key in use, so an API with thousands of customers keeps a bounded number (a Limiter is a few
# KB; one evicted is rebuilt from its name at its next use, its state lives in Redis).
MAX_CACHED_LIMITERS = 4096
_limiters: OrderedDict[str, Limiter] = OrderedDict()
_limiters_lock = threading.Lock()  # the engine's threads and its recorder share the cache


def api_limiter_name(api: Api, credential_key: str = "") -> str:
    """The API's own limiter is named after it; a credential key's is `{api}:{key}` (an API's
    name never holds ':', so no key's limiter is another API's)."""
    return f"{api.name}:{credential_key}" if credential_key else api.name


def api_limiter(api: Api, credential_key: str = "") -> Limiter:
    """The shared limiter for `api` (or for one of its credential keys: a bucket of its own with
    the API's limits, configured in Redis at its first use), carrying the API's current limits
    and their version, so a change of them reaches every key's bucket at its next grant."""
    name = api_limiter_name(api, credential_key)
    # Keyed by the prefix too: the namespace is a setting, and a limiter of one deployment must
    # never answer for another's (tests switch it).
    prefix = limiter_key_prefix()
    cache_key = f"{prefix}:{name}"
    with _limiters_lock:
        limiter = _limiters.get(cache_key)
        if limiter is None:
            limiter = _limiters[cache_key] = Limiter(
                redis_client(),
                name,
                key_prefix=prefix,
                # The chart's history is the API's: thousands of customers' buckets would
                # each hold 1.5 MB of it (RATE_SAMPLES_KEPT) in Redis.
                rate_samples_kept=0 if credential_key else RATE_SAMPLES_KEPT,
            )
            while len(_limiters) > MAX_CACHED_LIMITERS:
                _limiters.popitem(last=False)
        else:
            _limiters.move_to_end(cache_key)
    limiter.config = api.limiter_config()
    return limiter
