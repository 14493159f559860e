"""The Lua scripts, each prefixed with the part of the shared library (lua/lib/) it uses, and the
same scripts as one Redis function library (Redis 7's FUNCTION LOAD and FCALL)."""

from __future__ import annotations

import hashlib
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


# lib/time.lua's statement for Redis < 5's scripts: a library's load may not call it (nor read
# pcall), and every Redis with functions replicates a script's effects anyway.
_SCRIPTS_ONLY = "if redis.replicate_commands then\n  pcall(redis.replicate_commands)\nend\n"


def _function_library(bodies: dict[str, str]) -> tuple[str, dict[str, str]]:
    """The library text for FUNCTION LOAD, and each script's function name in it.

    A script run by EVALSHA runs its library's definitions again at every call (about a fifth of
    an acquire's Redis time); a function library runs them once, when it is loaded. Names carry a
    digest of the code: function names are global in a Redis, and during a rolling upgrade the
    workers of each version call their own."""

    def register(names: dict[str, str]) -> str:
        return "\n".join(
            f"redis.register_function('{names[name]}', function(KEYS, ARGV)\n{body}\nend)"
            for name, body in bodies.items()
        )

    if _SCRIPTS_ONLY not in PRELUDE:
        raise RuntimeError("lib/time.lua's scripts-only statement changed; update _SCRIPTS_ONLY")
    prelude = PRELUDE.replace(_SCRIPTS_ONLY, "")
    digest = hashlib.sha256(register({name: name for name in bodies}).encode())
    digest.update(prelude.encode())
    library = "ratejobs_" + digest.hexdigest()[:16]
    names = {name: f"{library}_{name}" for name in bodies}
    return f"#!lua name={library}\n{prelude}\n{register(names)}", names


_BODIES: dict[str, str] = {}
SOURCES: dict[str, str] = {}
for _name in SCRIPT_NAMES:
    _BODIES[_name] = _read(f"{_name}.lua")
    SOURCES[_name] = _library_for(_BODIES[_name], _LIBRARY_DEFINITIONS) + "\n" + _BODIES[_name]
FUNCTION_LIBRARY, FUNCTION_NAMES = _function_library(_BODIES)
