"""How deep a call's JSON may nest: one cap for every way in (the REST API's JSON, JSON lines,
the JSON cells of a CSV file), deeper than any call needs and far below where json.loads, or
a walk over what it built, would hit Python's recursion limit (a 500 instead of a 400)."""

from __future__ import annotations

import json
from typing import Any

# Levels of arrays and objects in one call, the call's own object counted.
MAX_JSON_DEPTH = 64
TOO_DEEP = f"JSON nested too deep: at most {MAX_JSON_DEPTH} levels"


class JsonTooDeep(ValueError):
    def __init__(self) -> None:
        super().__init__(TOO_DEEP)


def loads_bounded(text: str | bytes, *, outer_levels: int = 0) -> Any:
    """json.loads(text); JsonTooDeep when it nests deeper than MAX_JSON_DEPTH with
    `outer_levels` around it (1 for a value that sits inside a call); ValueError as json.loads
    raises it for text that is not JSON."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise JsonTooDeep from None
    if _deeper_than(value, MAX_JSON_DEPTH - outer_levels):
        raise JsonTooDeep
    return value


def _deeper_than(value: Any, levels: int) -> bool:
    """Whether `value` nests more than `levels` arrays and objects, walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > levels:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False
