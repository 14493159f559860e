"""The Lua scripts, each prefixed with the shared library (lua/lib/), read once at import."""

from __future__ import annotations

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
SOURCES: dict[str, str] = {name: PRELUDE + "\n" + _read(f"{name}.lua") for name in SCRIPT_NAMES}
