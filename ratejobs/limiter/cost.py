"""What a call really cost (tokens used), read from its response, to correct the estimate the
limiter charged for it when its slot was granted (the engine's attempts and the adapters)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping

from ratejobs.limiter.config import MAX_COST
from ratejobs.limiter.headers.values import normalise

# A dotted path of names into a JSON response: `usage.total_tokens`; a segment of digits also
# indexes a list (`data.0.tokens`).
COST_JSON_FIELD = re.compile(r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*")
_DIGITS = re.compile(r"\s*([0-9]{1,10})\s*")


def cost_from_response(
    headers: Mapping[str, str], body: bytes, *, header: str = "", json_field: str = ""
) -> int | None:
    """The cost the response reports: the `header` (case-insensitive) if it holds one, else
    the number at `json_field` in a JSON body; None when neither says (absent, not a whole
    number from 0 to MAX_COST, a body that is not JSON or was truncated). Whatever the API
    sends, this never raises: a garbled report leaves the estimate standing."""
    if header:
        cost = parse_cost(normalise(headers).get(header.lower()))
        if cost is not None:
            return cost
    if json_field and body:
        return parse_cost(_json_path(body, json_field))
    return None


def parse_cost(value: object) -> int | None:
    """A whole number of units from 0 to MAX_COST (an integer, a float with no fraction, or
    digits in a string); None for anything else."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str):
        match = _DIGITS.fullmatch(value)
        value = int(match.group(1)) if match else None
    elif isinstance(value, float):
        value = int(value) if math.isfinite(value) and value.is_integer() else None
    if isinstance(value, int) and 0 <= value <= MAX_COST:
        return value
    return None


def _json_path(body: bytes, path: str) -> object:
    if body.lstrip()[:1] not in (b"{", b"["):
        return None  # not JSON: not worth a parse
    try:
        value: object = json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    for name in path.split("."):
        if isinstance(value, dict):
            value = value.get(name)
        elif isinstance(value, list) and name.isdigit() and int(name) < len(value):
            value = value[int(name)]
        else:
            return None
    return value
