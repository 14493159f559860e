"""The Lua scripts, each prefixed with the part of the shared library (lua/lib/) it uses."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

SCRIPT_NAMES = (
    "acquire",
    "acquire_many",
    "release",
    "feedback",
    "feedback_many",
    "configure",
    "settle",
    "state",
    "clock",
)

# The library's files, one concern each, in the order they are joined: Lua sees a `local` only
# after its definition, so a file may use what the files before it define and nothing after.
LIBRARY = (
    "time",  # Redis TIME in µs, numbers as exact strings
    "config",  # the config hash and its windows
    "state",  # the state hash by field name, generations, event counters
    "refunds",  # the cost windows' headroom history, give_back
    "adaptive",  # CUBIC and learning the real limit
    "history",  # the rate history samples
    "schedule",  # GCRA with reservation over the main rate and the windows
    "leases",  # the in-flight cap and wake-ups
    "signals",  # what a block or a throttle does (feedback scripts)
    "lifetimes",  # key expiry and the refund history's bound in time
)


def _read(*parts: str) -> str:
    return resources.files(__package__).joinpath("lua", *parts).read_text(encoding="utf-8")


PRELUDE = "\n".join(_read("lib", f"{name}.lua") for name in LIBRARY)

_BLOCK_COMMENT = re.compile(r"^--\[\[.*?\]\]\n", re.M | re.S)
_DEFINED = re.compile(r"^local\s+(?:function\s+(\w+)|([\w\s,]+?)\s*=)")
_WORD = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True)
class _Definition:
    names: frozenset[str]
    uses: frozenset[str]
    text: str


def _definitions(library: str) -> list[_Definition]:
    """The library's top-level statements in order: each starts at column 0 with `local` or `if`
    (bodies are indented; comments at column 0 are dropped)."""
    chunks: list[list[str]] = []
    for line in _BLOCK_COMMENT.sub("", library).splitlines():
        if line.startswith("--"):
            continue
        if line.startswith(("local ", "if ")) or not chunks:
            chunks.append([])
        chunks[-1].append(line)
    found = []
    for lines in chunks:
        text = "\n".join(lines)
        match = _DEFINED.match(text)
        names = frozenset()
        if match:
            names = frozenset(n.strip() for n in (match[1] or match[2]).split(","))
        found.append(_Definition(names, frozenset(_WORD.findall(text)) - names, text))
    return found


def _library_for(body: str, definitions: list[_Definition]) -> str:
    """Only the library a script uses, directly or through what it uses: Redis runs a script's
    whole text at every call, and making the closures of the library's 70 functions cost every
    call about 30 µs of Redis time (a third of an acquire's), whether it used them or not."""
    wanted = set(_WORD.findall(body))
    kept = [False] * len(definitions)
    for i in reversed(range(len(definitions))):
        d = definitions[i]
        if not d.names or d.names & wanted:
            kept[i] = True
            wanted |= d.uses
    return "\n".join(d.text for d, keep in zip(definitions, kept, strict=True) if keep)


_LIBRARY_DEFINITIONS = _definitions(PRELUDE)
SOURCES: dict[str, str] = {}
for _name in SCRIPT_NAMES:
    _body = _read(f"{_name}.lua")
    SOURCES[_name] = _library_for(_body, _LIBRARY_DEFINITIONS) + "\n" + _body
