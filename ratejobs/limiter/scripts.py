"""The Lua scripts, each prefixed with the shared prelude, read once at import."""

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


def _read(name: str) -> str:
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


_PRELUDE = _read("prelude")
SOURCES: dict[str, str] = {name: _PRELUDE + "\n" + _read(name) for name in SCRIPT_NAMES}
